"""SLURM for real: hydra/launcher=slurm_cpu through submitit, on a running scheduler.

A two-point sweep; pre-emption (`scontrol requeue`) and a time limit (signal_delay_s) survived, each
resumed by trainer.resume=auto into the same run directory and bit-identical to an uninterrupted run;
a 2-task DDP job in one allocation that matches torchrun's; submissions SLURM refuses and a job it
cancels, each ending the launcher with a message. Marked `slurm` and skipped where no SLURM controller
answers: `make test-slurm` starts the one-node cluster of scripts/local_slurm.sh, runs them, stops it.
The timelines they log (-o log_cli=true) are the ones docs/scaling.md quotes.
The unmarked tests at the end need no SLURM: the hand-over of submitit's signal, and the config.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest
from conftest import CONFIG_DIR, ROOT, TINY, run_train
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_checkpoints import assert_same_state
from test_distributed import ddp_job

from gan.checkpoint import load_checkpoint
from gan.training.faults import stop_on_signals

log = logging.getLogger(__name__)

# Long enough a run that SLURM's time-limit signal lands while it trains (TIME_LIMIT): this many seconds of
# training at this machine's speed, measured first (long_run)
TRAINING_S = 60
# What every long run writes: a log line each 250 steps (the requeue test waits for step 500), no samples or checkpoints
# but the one a signal or the end writes (what a resume must recover is then all in that one)
QUIET = ("trainer.log_every=250", "trainer.sample_every=1000000", "trainer.checkpoint_every=1000000")
# a line of Hydra's log format: [2026-11-24 14:18:39,440][gan.training.faults][WARNING] - SIGUSR2 received: ...
LOG_LINE = re.compile(r"^\[(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[[\w.]+\]\[\w+\] - (?P<text>.*)$")


def slurm_problem() -> Optional[str]:
    """Why the tests marked `slurm` cannot run here, or None when a controller answers."""
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        return "no SLURM here (no sbatch/scontrol on PATH): `make test-slurm` starts a one-node cluster and runs these"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "no SLURM controller answered `scontrol ping` within 20 s"
    if " is UP" not in ping.stdout:
        answer = ((ping.stdout + ping.stderr).strip().splitlines() or ["no answer"])[0]
        start = "`scripts/local_slurm.sh start` starts one, or `make test-slurm` starts it and runs these"
        return f"no SLURM controller is up (`scontrol ping`: {answer}): {start}"
    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        return "hydra-submitit-launcher is not installed: pip install -c constraints.txt -e '.[slurm]'"
    return None


@pytest.fixture(scope="module")
def slurm() -> None:
    if problem := slurm_problem():
        pytest.skip(problem)


# a sweep through the launcher, and what it leaves ------------------------------------------------


@dataclasses.dataclass
class Sweep:
    """`python train.py -m hydra/launcher=slurm_cpu ...` running in the background."""

    folder: Path  # hydra.sweep.dir
    name: str  # the SLURM job name, this test's own
    process: subprocess.Popen
    output: Path  # the launcher's stdout and stderr
    started: datetime  # when it was launched: older accounting records are another cluster's life

    def wait(self, timeout: float) -> tuple[int, str]:
        """The launcher's exit code and output; the test fails past `timeout` (`launch` then kills it)."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launcher did not end within {timeout:.0f} s:\n{self.text()[-3000:]}")
        return code, self.text()

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def job_ids(self) -> list[str]:
        """The sweep's SLURM jobs, from submitit's folders holding a pickle: `12`, or `13_0` and `13_1` (an array)."""
        return sorted(p.parent.name for p in (self.folder / ".submitit").glob("*/*_submitted.pkl"))

    def log(self, job: str, task: int = 0, stream: str = "out") -> Path:
        """submitit's log of one task of one job, where docs/scaling.md says it is."""
        return self.folder / ".submitit" / job / f"{job}_{task}_log.{stream}"

    def run_dirs(self) -> list[Path]:
        return sorted(p.parent for p in self.folder.glob("*/.hydra"))


@pytest.fixture
def launch(slurm, tmp_path) -> Iterator[Callable[..., Sweep]]:
    """launch(*overrides): a sweep of tiny runs in tmp_path, jobs named for this test; at the end: killed, cancelled."""
    name = f"dcgan-test-{uuid.uuid4().hex[:8]}"
    sweeps: list[Sweep] = []

    def start(*overrides: str) -> Sweep:
        sweeps.append(start_sweep(*overrides, cwd=tmp_path, name=name))
        return sweeps[-1]

    yield start
    for sweep in sweeps:
        if sweep.process.poll() is None:
            sweep.process.kill()
            sweep.process.wait()
    subprocess.run(["scancel", f"--name={name}"], check=False)


def start_sweep(*overrides: str, cwd: Path, name: str) -> Sweep:
    """`python train.py -m hydra/launcher=slurm_cpu` of tiny runs with trainer.resume=auto, as docs/scaling.md's."""
    folder, output = cwd / "sweep", cwd / "launcher.log"
    args = [sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=slurm_cpu", f"hydra.launcher.name={name}"]
    args += [f"hydra.sweep.dir={folder}", *TINY, "trainer.resume=auto", *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}
    started = datetime.now().replace(microsecond=0)
    with open(output, "w") as sink:  # the child holds its own copy of the descriptor
        process = subprocess.Popen(args, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)
    return Sweep(folder, name, process, output, started)


def wait_for_job(sweep: Sweep, timeout: float = 120) -> str:
    """The id of the sweep's one job, once submitit has made its folder."""
    deadline = time.monotonic() + timeout
    while not sweep.job_ids():
        if sweep.process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no job was submitted:\n{sweep.text()[-3000:]}")
        time.sleep(0.5)
    [job] = sweep.job_ids()
    return job


def wait_for_step(sweep: Sweep, job: str, step: int, timeout: float = 180) -> None:
    """Until the job's log shows training at or past `step`."""
    deadline = time.monotonic() + timeout
    pattern = re.compile(r"\] - step (\d+) ")
    while time.monotonic() < deadline:
        path = sweep.log(job)
        text = path.read_text(errors="replace") if path.is_file() else ""
        if any(int(m.group(1)) >= step for m in pattern.finditer(text)):
            return
        if sweep.process.poll() is not None:
            pytest.fail(f"the launcher ended before step {step}:\n{sweep.text()[-3000:]}\n{text[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"step {step} not reached within {timeout} s")


SACCT_FIELDS = ("JobID", "State", "Submit", "Eligible", "Start", "End")


def sacct(sweep: Sweep, job: str, final: str = "COMPLETED", timeout: float = 30) -> list[dict[str, str]]:
    """Every run of the sweep's job, requeued ones included (--duplicates), oldest first, once the last one reads
    `final`: slurmctld hands the records to slurmdbd a moment after the job ends. Only since the sweep started: a
    cluster whose state was wiped numbers its jobs from 1 again, and the database may still hold the old ones."""
    deadline = time.monotonic() + timeout
    query = ["sacct", "-j", job, "-S", sweep.started.isoformat(), "--duplicates", "-n", "-P"]
    query += ["-o", ",".join(SACCT_FIELDS)]
    while True:
        out = subprocess.run(query, capture_output=True, text=True, check=True).stdout
        rows = [dict(zip(SACCT_FIELDS, line.split("|"))) for line in out.splitlines()]
        runs = [row for row in rows if row["JobID"] == job]  # the allocation, not its .batch and .0 steps
        if (runs and runs[-1]["State"].startswith(final)) or time.monotonic() > deadline:
            return runs
        time.sleep(1)


def log_lines(text: str) -> list[tuple[datetime, str]]:
    """(time, text) of each line logged through Hydra's format, in order."""
    matches = (LOG_LINE.match(line) for line in text.splitlines())
    return [(datetime.strptime(m["time"], "%Y-%m-%d %H:%M:%S,%f"), m["text"]) for m in matches if m]


def first(lines: list[tuple[datetime, str]], text: str, after: Optional[datetime] = None) -> tuple[datetime, str]:
    """The first line containing `text` (at or after `after`); fails naming it when there is none."""
    for when, line in lines:
        if text in line and (after is None or when >= after):
            return when, line
    pytest.fail(f"no log line with {text!r}" + (f" after {after}" if after else ""))


def slurm_time(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S")


def log_timeline(title: str, events: list[tuple[str, datetime]]) -> None:
    """The events in seconds from the first: what docs/scaling.md's timeline quotes."""
    zero = events[0][1]
    rows = "\n".join(f"  {(when - zero).total_seconds():7.2f} s  {what}" for what, when in events)
    log.info("%s\n%s", title, rows)


@dataclasses.dataclass(frozen=True)
class LongRun:  # the uninterrupted run the interrupted ones must match
    steps: int
    state: dict  # the checkpoint of the uninterrupted run


@pytest.fixture(scope="module")
def long_run(slurm, tmp_path_factory) -> LongRun:
    """A tiny run of about TRAINING_S seconds of training on this machine, and its checkpoint when it runs through
    without a stop. Its length is measured, not fixed: on a faster machine a fixed step count could end before SLURM's
    time-limit signal (which lands 15 to 45 s into a job)."""
    folder = tmp_path_factory.mktemp("long_run")
    probe = run_train("trainer.max_steps=700", *QUIET, "trainer.log_every=100", cwd=folder, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    times = {}
    for when, text in log_lines(probe.stdout + probe.stderr):
        if step := re.match(r"step (\d+) ", text):
            times.setdefault(int(step[1]), when)
    rate = 500 / (times[700] - times[200]).total_seconds()
    steps = max(3000, round(rate * TRAINING_S / 250) * 250)
    log.info("%.0f steps/s here: the long run is %d steps", rate, steps)
    reference = run_train(f"trainer.max_steps={steps}", *QUIET, f"hydra.run.dir={folder}/run", cwd=folder, timeout=600)
    assert reference.returncode == 0, reference.stderr[-3000:]
    return LongRun(steps, load_checkpoint(folder / "run"))


def assert_one_run_resumed(sweep: Sweep, job: str, long: LongRun, resumes: int) -> Path:
    """One run directory, continued `resumes` times from its own checkpoint, finished, bit-identical."""
    [run_dir] = sweep.run_dirs()
    lines = log_lines(sweep.log(job).read_text(errors="replace"))
    resumed = [text for _, text in lines if text.startswith("Resumed from")]
    assert len(resumed) == resumes, resumed
    assert all(f"{run_dir}/checkpoints/last.pt" in text for text in resumed), resumed
    first(lines, f"Done: {long.steps} steps")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.pt"]
    assert len(list((run_dir / "tb").glob("events.out.tfevents.*"))) == resumes + 1  # one per part
    assert_same_state(long.state, load_checkpoint(run_dir))
    return run_dir


# the tests on SLURM -------------------------------------------------------------------------------


@pytest.mark.slurm
def test_a_two_point_sweep_runs_as_two_slurm_jobs(launch):
    sweep = launch("optim.lr=1e-4,4e-4")
    code, output = sweep.wait(timeout=240)
    assert code == 0, output[-3000:]
    jobs = sweep.job_ids()
    assert len(jobs) == 2 and jobs[0].endswith("_0") and jobs[1].endswith("_1"), jobs  # one array, two tasks
    runs = sweep.run_dirs()
    assert sorted(OmegaConf.load(run / ".hydra" / "config.yaml").optim.lr for run in runs) == [1e-4, 4e-4]
    for run in runs:
        assert load_checkpoint(run)["step"] == 6
        assert list((run / "tb").glob("events.out.tfevents.*"))
    for job in jobs:
        assert "Done: 6 steps" in sweep.log(job).read_text()
        assert sweep.log(job, stream="err").is_file()
        assert sacct(sweep, job)[-1]["State"] == "COMPLETED"


@pytest.mark.slurm
def test_a_requeued_job_checkpoints_and_resumes_bit_exactly(launch, long_run):
    """`scontrol requeue` does what pre-emption with PreemptMode=REQUEUE does: SIGTERM to every task, SIGKILL KillWait
    seconds later, the job back in the queue. The loop writes its checkpoint on the SIGTERM; the job starts again from
    the top, and trainer.resume=auto finds that checkpoint in the job's own folder."""
    sweep = launch(f"trainer.max_steps={long_run.steps}", *QUIET)
    job = wait_for_job(sweep)
    wait_for_step(sweep, job, 500)
    requeued_at = datetime.now()
    subprocess.run(["scontrol", "requeue", job], check=True)
    code, output = sweep.wait(timeout=600)
    assert code == 0, output[-3000:]

    run_dir = assert_one_run_resumed(sweep, job, long_run, resumes=1)
    lines = log_lines(sweep.log(job).read_text(errors="replace"))
    signalled, _ = first(lines, "SIGTERM received")
    stopped, text = first(lines, "Stopped by SIGTERM at step")
    step = int(re.search(r"at step (\d+)", text)[1])
    resumed, text = first(lines, "Resumed from")
    assert f"at step {step}" in text  # the checkpoint the signal wrote
    done, _ = first(lines, "Done:")
    runs = sacct(sweep, job)
    assert [run["State"] for run in runs] == ["REQUEUED", "COMPLETED"], runs
    log_timeline(
        f"scontrol requeue of job {job} at step {step} ({run_dir})",
        [
            ("scontrol requeue", requeued_at),
            ("SIGTERM in the job", signalled),
            (f"checkpoint of step {step} written, run exits", stopped),
            ("sacct: first run ended, REQUEUED (whole seconds)", slurm_time(runs[0]["End"])),
            ("sacct: eligible again", slurm_time(runs[1]["Eligible"])),
            ("sacct: second run started", slurm_time(runs[1]["Start"])),
            (f"resumed at step {step} (the job's log)", resumed),
            (f"done, step {long_run.steps}", done),
        ],
    )


# A 1-minute limit with signal_delay_s=15. slurmctld looks at time limits every 30 s and sends the signal at the first
# look that finds at most signal_delay_s + 30 s left: 15 to 45 s into each run, after this job's start-up (about 5 s)
# and long before the limit's own SIGTERM at 60 s. Each run trains 10 to 40 s: 10 requeues are enough to finish.
TIME_LIMIT = ("hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=15", "hydra.launcher.max_num_timeout=10")


@pytest.mark.slurm
def test_a_job_at_its_time_limit_checkpoints_requeues_and_resumes_bit_exactly(launch, long_run):
    """SLURM sends SIGUSR2 signal_delay_s before the limit (sbatch --signal, set by submitit). The loop takes it as a
    stop: it writes its checkpoint, then hands the signal to submitit's handler, which requeues the job (scontrol
    requeue) and exits; trainer.resume=auto continues the run."""
    sweep = launch(*TIME_LIMIT, f"trainer.max_steps={long_run.steps}", *QUIET)
    job = wait_for_job(sweep)
    code, output = sweep.wait(timeout=900)
    assert code == 0, output[-3000:]

    lines = log_lines(sweep.log(job).read_text(errors="replace"))
    signals = [when for when, text in lines if text.startswith("SIGUSR2 received")]
    assert signals, "the time-limit signal never reached the loop"
    handed = [when for when, text in lines if "passed on to submitit" in text]
    requeues = [when for when, text in lines if text.startswith("Requeued job")]
    assert len(handed) == len(requeues) == len(signals)  # each signal: checkpoint first, then requeue
    runs = sacct(sweep, job)
    # The last run may end just as slurmctld's next look (every 30 s) sends the signal again: the process, past
    # submitit's "Exiting after successful completion", dies of SIGUSR2 and sacct says FAILED. The run itself is whole
    # (assert_one_run_resumed), so that state is accepted only after that line.
    exited = [when for when, text in lines if text == "Exiting after successful completion" and when > signals[-1]]
    last = "FAILED" if exited and runs[-1]["State"] == "FAILED" else "COMPLETED"
    assert [run["State"] for run in runs] == ["REQUEUED"] * len(signals) + [last], runs
    run_dir = assert_one_run_resumed(sweep, job, long_run, resumes=len(signals))
    resumed, text = first(lines, "Resumed from", after=signals[0])
    step = int(re.search(r"at step (\d+)", text)[1])
    done, _ = first(lines, "Done:")
    started = slurm_time(runs[0]["Start"])
    log_timeline(
        f"time limit of job {job}: {len(signals)} requeue(s) ({run_dir})",
        [
            ("first run started (sacct, whole seconds); its limit is 60 s later", started),
            ("SIGUSR2 in the job (signal_delay_s=15)", signals[0]),
            (f"checkpoint of step {step} written, signal handed to submitit", handed[0]),
            ("submitit: scontrol requeue done, run exits", requeues[0]),
            ("sacct: first run ended, REQUEUED", slurm_time(runs[0]["End"])),
            ("sacct: eligible again", slurm_time(runs[1]["Eligible"])),
            ("sacct: second run started", slurm_time(runs[1]["Start"])),
            (f"resumed at step {step} (the job's log)", resumed),
            (f"done, step {long_run.steps}, after {len(signals)} requeue(s)", done),
        ],
    )


@pytest.mark.slurm
def test_a_two_task_job_is_one_ddp_run_that_matches_torchruns(launch, tmp_path):
    cpus = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, check=True).stdout.split()
    if max(int(c.rstrip("+")) for c in cpus) < 2:
        pytest.skip("the SLURM nodes have one CPU each: a 2-task job would never start")
    sweep = launch("hydra.launcher.tasks_per_node=2", "trainer.max_steps=8")
    code, output = sweep.wait(timeout=240)
    assert code == 0, output[-3000:]
    [job] = sweep.job_ids()
    assert "2 process(es)" in sweep.log(job, task=0).read_text()
    assert sweep.log(job, task=1).is_file()  # the second task ran, and said nothing (rank 0 speaks)
    [run_dir] = sweep.run_dirs()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launcher.log", "sweep"]  # rank 1 wrote nothing
    torchrun_dir = tmp_path / "torchrun"
    ddp_job("trainer.max_steps=8", f"hydra.run.dir={torchrun_dir}", cwd=tmp_path)
    state = load_checkpoint(run_dir)
    assert len(state["rng_ranks"]) == 2
    assert_same_state(load_checkpoint(torchrun_dir), state)


REJECTED = {  # an override sbatch refuses (mem_gb=100000: 100 TB) -> what it says
    "unknown-partition": ("hydra.launcher.partition=no-such-partition", "Invalid partition name specified"),
    "more-memory-than-the-node": ("hydra.launcher.mem_gb=100000", "Requested node configuration is not available"),
}


@pytest.mark.slurm
@pytest.mark.parametrize(("override", "message"), REJECTED.values(), ids=REJECTED)
def test_a_submission_slurm_refuses_ends_the_launcher_with_sbatchs_message(launch, override, message):
    sweep = launch(override)
    code, output = sweep.wait(timeout=120)
    assert code != 0 and message in output, output[-3000:]
    assert "sbatch: error:" in output.strip().splitlines()[-1]  # the last line says it, after the traceback
    queued = subprocess.run(["squeue", "-h", f"--name={sweep.name}"], capture_output=True, text=True, check=True)
    assert queued.stdout.strip() == ""
    assert sweep.run_dirs() == []


@pytest.mark.slurm
def test_a_cancelled_job_ends_the_launcher_with_its_state_and_leaves_a_checkpoint(launch):
    """submitit waits for a job's result file, and asks sacct whether the job still runs: a job that ends without one
    (scancel, a node lost) is reported, not waited for. scancel sends SIGTERM first, so the run writes its checkpoint,
    and the same sweep with trainer.resume=auto would continue it."""
    sweep = launch("trainer.max_steps=1000000", *QUIET)
    job = wait_for_job(sweep)
    wait_for_step(sweep, job, 250)
    subprocess.run(["scancel", job], check=True)
    code, output = sweep.wait(timeout=180)
    assert code != 0
    assert "has not produced any output (state: CANCELLED" in output, output[-3000:]
    [run_dir] = sweep.run_dirs()
    assert load_checkpoint(run_dir)["step"] >= 250


# without SLURM: the hand-over of submitit's signal, the config ------------------------------------


@pytest.fixture
def submitit_handler(monkeypatch) -> Iterator[list[int]]:
    """What a submitit job has: SUBMITIT_EXECUTOR set and a Python handler on SIGUSR2 (here one recording its calls)."""
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    calls: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    yield calls
    signal.signal(signal.SIGUSR2, previous)


def test_sigusr2_reaches_submitit_after_a_block_that_succeeds_in_a_submitit_job_only(submitit_handler, monkeypatch):
    with stop_on_signals() as flag:
        signal.raise_signal(signal.SIGUSR2)
        assert flag.reason == "SIGUSR2"  # a stop, as SIGTERM is: the loop writes its checkpoint
        assert submitit_handler == []  # submitit would requeue and exit here, mid-step
    assert submitit_handler == [signal.SIGUSR2]  # after the checkpoint: submitit requeues the job
    assert callable(signal.getsignal(signal.SIGUSR2))
    submitit_handler.clear()
    with pytest.raises(RuntimeError), stop_on_signals():
        signal.raise_signal(signal.SIGUSR2)
        raise RuntimeError("the loop failed after the signal: no checkpoint to requeue with")
    assert submitit_handler == []  # not handed on
    monkeypatch.delenv("SUBMITIT_EXECUTOR")  # outside a submitit job: SIGUSR2 is left to its own handler
    with stop_on_signals() as flag:
        signal.raise_signal(signal.SIGUSR2)
        assert flag.reason is None and submitit_handler == [signal.SIGUSR2]


def test_the_cpu_launcher_is_the_slurm_launcher_without_gpus():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm extra is not installed")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        gpu = compose("train", overrides=["hydra/launcher=slurm"], return_hydra_config=True).hydra.launcher
        cpu = compose("train", overrides=["hydra/launcher=slurm_cpu"], return_hydra_config=True).hydra.launcher
    assert cpu._target_ == gpu._target_ and cpu._target_.endswith("SlurmLauncher")
    assert (cpu.gpus_per_node, cpu.tasks_per_node, cpu.cpus_per_task) == (None, 1, 1)
    assert gpu.gpus_per_node == 4
    # pre-emption settings come from slurm.yaml, the same for both
    assert (cpu.max_num_timeout, cpu.signal_delay_s) == (gpu.max_num_timeout, gpu.signal_delay_s) == (5, 120)
