#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, from Debian's packages (slurm-wlm 22.05), for the tests
# marked `slurm` (make test-slurm) and for trying hydra/launcher=slurm_cpu by hand (docs/scaling.md).
#
#   scripts/local_slurm.sh start    install what is missing, write the configs, start the daemons,
#                                   wait until `sinfo` shows the node idle (idempotent)
#   scripts/local_slurm.sh stop     stop every daemon it started (idempotent)
#   scripts/local_slurm.sh status   which daemons run, and sinfo
#
# Needs root (apt-get, daemons, /etc/slurm) on Debian 12 or another Debian/Ubuntu with slurm-wlm.
# What runs: munged (authentication), mariadbd + slurmdbd (job accounting, so that `sacct` answers:
# submitit asks sacct for the state of the jobs it waits on, and without it a job that dies without
# its result file would keep the launcher waiting), slurmctld (the scheduler) and slurmd (the node).
# No cgroups and no GPUs: proctrack/linuxproc and task/none work inside a container, where cgroups
# are often read-only. The node takes this machine's CPUs and memory from `slurmd -C`.
# The node and the controller are this host (`hostname -s`), which must resolve (it does in /etc/hosts).
set -euo pipefail

CLUSTER=local
PARTITION=debug
CONF_DIR=/etc/slurm
SLURM_CONF=$CONF_DIR/slurm.conf
DBD_CONF=$CONF_DIR/slurmdbd.conf
MARKER="# Written by dcgan-reference scripts/local_slurm.sh"
LOG_DIR=/var/log/local-slurm
RUN_DIR=/run/local-slurm
STATE_DIR=/var/spool/local-slurm
DB_SOCKET=/run/mysqld/mysqld.sock
DB_PASS=local-slurm-only  # a throwaway cluster on one machine; the database listens on its socket alone
WAIT_S=${LOCAL_SLURM_WAIT_S:-60}
PACKAGES=(munge slurm-wlm slurmdbd mariadb-server)
CHANGED=0  # set when slurm.conf was written with other contents than it had

say() { echo "local_slurm: $*"; }

die() {  # die MESSAGE [DAEMON...]: the message, then those daemons' last log lines (why it did not come up)
    say "ERROR: $1" >&2
    shift
    local name
    for name in "$@"; do
        [[ -s $LOG_DIR/$name.log ]] || continue
        echo "---- last lines of $LOG_DIR/$name.log" >&2
        tail -n 12 "$LOG_DIR/$name.log" >&2
    done
    exit 1
}

running() {  # running PIDFILE NAME: the process the file names is alive and is NAME (not a reused pid)
    [[ -s $1 ]] && [[ $(cat "/proc/$(cat "$1")/comm" 2>/dev/null) == "$2" ]]
}

wait_for() {  # wait_for DAEMON SECONDS COMMAND...: poll until COMMAND succeeds, or die with DAEMON's log
    local daemon=$1 seconds=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "$daemon did not come up within ${seconds} s (\`$*\` kept failing)" "$daemon"
        sleep 0.2
    done
}

install_packages() {
    local missing=()
    for cmd in munged slurmctld slurmd slurmdbd mariadbd sinfo sacct; do
        command -v "$cmd" >/dev/null || missing+=("$cmd")
    done
    ((${#missing[@]} == 0)) && return
    [[ $EUID -eq 0 ]] || die "${missing[*]} missing; run as root to install ${PACKAGES[*]} with apt-get"
    say "installing ${PACKAGES[*]} (missing: ${missing[*]})"
    local start=$SECONDS
    apt-get update -qq || die "apt-get update failed"
    # no recommends: slurm-wlm would bring a mail server and documentation along
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null \
        || die "apt-get could not install ${PACKAGES[*]}"
    say "installed in $((SECONDS - start)) s"
}

write_configs() {
    if [[ -e $SLURM_CONF ]] && ! grep -qF "$MARKER" "$SLURM_CONF"; then
        die "$SLURM_CONF exists and was not written by this script: a real cluster's? Left as it is."
    fi
    local host node memory
    host=$(hostname -s)
    # `slurmd -C` prints this machine as slurm.conf describes a node: CPUs, sockets, cores, RealMemory
    node=$(slurmd -C | head -n 1)
    memory=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
    # 95% of it: slurmd drains a node whose configured memory exceeds what it finds at start
    node=$(sed "s/RealMemory=[0-9]*/RealMemory=$((memory * 95 / 100))/" <<<"$node")
    mkdir -p "$CONF_DIR" "$LOG_DIR" "$RUN_DIR" "$STATE_DIR/ctld" "$STATE_DIR/d"
    cat >"$SLURM_CONF.new" <<EOF
$MARKER: a one-node cluster on $host.
ClusterName=$CLUSTER
SlurmctldHost=$host
# every daemon as root: a throwaway cluster on one machine, jobs run as whoever submits them
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/d
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
# no cgroups: processes are tracked through /proc, tasks are not bound to cores
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
# accounting through slurmdbd, so that sacct (and submitit, which polls it) sees every job
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
MpiDefault=none
SwitchType=switch/none
# CPUs and memory are both consumable: two 1-CPU jobs share the node, a job asking for more memory
# than the node has is refused at submission
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
ReturnToService=2
# requeued jobs (scontrol requeue, submitit's own requeue on time-out) run again
JobRequeue=1
# A requeued job may start again cred_expire seconds after its requeue (Slurm's default, 120 s, is
# what a real cluster makes it wait), and pending jobs are looked at every sched_interval seconds
# (default 60) and bf_interval (30): 10 and 2 here, so that the tests' requeues take seconds
AuthInfo=cred_expire=10
SchedulerParameters=sched_interval=2,bf_interval=2
$node State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    if cmp -s "$SLURM_CONF.new" "$SLURM_CONF"; then
        rm "$SLURM_CONF.new"
    else
        mv "$SLURM_CONF.new" "$SLURM_CONF"
        CHANGED=1
    fi
    cat >"$DBD_CONF" <<EOF
$MARKER
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$RUN_DIR/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$DBD_CONF"  # slurmdbd refuses a config others can read (it holds the password)
}

start_munge() {
    running /run/munge/munged.pid munged && return
    mkdir -p /run/munge && chown munge:munge /run/munge
    # the package's postinst makes the key; a copied image may lack it
    [[ -s /etc/munge/munge.key ]] || { mungekey --create --keyfile=/etc/munge/munge.key && chown munge:munge /etc/munge/munge.key; }
    # munged wants its log file its own
    touch "$LOG_DIR/munged.log" && chown munge:munge "$LOG_DIR/munged.log"
    runuser -u munge -- /usr/sbin/munged --log-file="$LOG_DIR/munged.log" || die "munged did not start" munged
    wait_for munged 10 munge -n
}

start_database() {
    if ! running /run/mysqld/mysqld.pid mariadbd; then
        mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
        touch "$LOG_DIR/mariadb.log" && chown mysql:mysql "$LOG_DIR/mariadb.log"
        # native AIO is not available in every container (gVisor); no TCP port, the socket is enough
        setsid /usr/sbin/mariadbd --user=mysql --skip-networking --innodb-use-native-aio=0 \
            --socket="$DB_SOCKET" --pid-file=/run/mysqld/mysqld.pid --log-error="$LOG_DIR/mariadb.log" \
            </dev/null >/dev/null 2>&1 &
        wait_for mariadb 30 mariadb-admin --socket="$DB_SOCKET" ping
    fi
    # root connects through the socket (unix_socket authentication, Debian's default)
    mariadb --socket="$DB_SOCKET" -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" || die "could not set up slurmdbd's database user" mariadb
}

start_slurm() {
    if ! running "$RUN_DIR/slurmdbd.pid" slurmdbd; then
        slurmdbd || die "slurmdbd did not start" slurmdbd
    fi
    wait_for slurmdbd 20 sacctmgr -n list cluster
    if [[ -z $(sacctmgr -n -P list cluster format=cluster where cluster="$CLUSTER") ]]; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "could not register cluster $CLUSTER with slurmdbd" slurmdbd
    fi
    if running "$RUN_DIR/slurmctld.pid" slurmctld; then
        # already up: a changed slurm.conf is read again (by the node's daemon too); a few settings,
        # AuthInfo's cred_expire among them, take effect only at a restart (stop, then start)
        if ((CHANGED)); then scontrol reconfigure || die "scontrol reconfigure failed" slurmctld; fi
    else
        slurmctld || die "slurmctld did not start" slurmctld
    fi
    wait_for slurmctld 20 scontrol ping
    running "$RUN_DIR/slurmd.pid" slurmd || slurmd || die "slurmd did not start" slurmd
}

node_idle() {
    [[ $(sinfo -h -N -o %T 2>/dev/null | sort -u) =~ ^(idle|mixed|allocated)$ ]]
}

start() {
    [[ $EUID -eq 0 ]] || die "run as root: it starts daemons and writes $CONF_DIR"
    local begin=$SECONDS
    install_packages
    local t0=$SECONDS
    write_configs
    start_munge
    start_database
    start_slurm
    # a node drained by an earlier run (a daemon killed mid-job) is taken back into service
    scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true
    wait_for slurmd "$WAIT_S" node_idle  # the node registered with slurmctld: sinfo shows it idle
    local installing=""
    ((t0 > begin)) && installing=", after $((t0 - begin)) s of installing"
    say "cluster '$CLUSTER' up in $((SECONDS - t0)) s$installing"
    sinfo
}

stop_pidfile() {  # stop_pidfile NAME PIDFILE: SIGTERM, up to 20 s, then SIGKILL
    local name=$1 file=$2
    running "$file" "$name" || return 0
    local pid
    pid=$(cat "$file")
    kill "$pid"
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || { say "stopped $name"; return 0; }
        sleep 0.2
    done
    say "$name (pid $pid) ignored SIGTERM for 20 s: SIGKILL"
    kill -9 "$pid" 2>/dev/null || true
}

stop() {
    stop_pidfile slurmd "$RUN_DIR/slurmd.pid"
    stop_pidfile slurmctld "$RUN_DIR/slurmctld.pid"
    stop_pidfile slurmdbd "$RUN_DIR/slurmdbd.pid"
    stop_pidfile mariadbd /run/mysqld/mysqld.pid
    stop_pidfile munged /run/munge/munged.pid
}

status() {
    local name file
    for name in munged:/run/munge/munged.pid mariadbd:/run/mysqld/mysqld.pid slurmdbd:$RUN_DIR/slurmdbd.pid \
        slurmctld:$RUN_DIR/slurmctld.pid slurmd:$RUN_DIR/slurmd.pid; do
        file=${name#*:}
        if running "$file" "${name%%:*}"; then echo "${name%%:*}: running (pid $(cat "$file"))"; else echo "${name%%:*}: stopped"; fi
    done
    sinfo 2>/dev/null || true
}

case ${1:-} in
start) start ;;
stop) stop ;;
status) status ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
