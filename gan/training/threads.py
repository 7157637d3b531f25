"""trainer.threads=0 on the CPU: torch's threads follow the cores other processes leave free, since beside a
busy process one time-sliced chunk stalls every OpenMP region (docs/speed.md#sharing-the-machine).
A changed count changes oneDNN's reductions: `trainer.threads=N` keeps CPU runs bit-exact."""

import logging
import math
import os
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from gan.device import available_cpus

log = logging.getLogger(__name__)

CLOCK_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_busy_seconds(cpus: Optional[set[int]] = None) -> Optional[float]:
    """All processes' busy CPU seconds since boot on this process's CPUs; None off Linux."""
    cpus = os.sched_getaffinity(0) if cpus is None and hasattr(os, "sched_getaffinity") else cpus
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    total = 0.0
    for line in lines:
        if not line.startswith("cpu") or line.startswith("cpu "):  # per-CPU lines only, not the total
            continue
        name, *fields = line.split()
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
        total += user + nice + system + irq + softirq + steal
    return total / CLOCK_TICK


def own_busy_seconds(pid: Optional[int] = None) -> float:
    pid = pid or os.getpid()
    total = 0.0
    for stat in [Path(f"/proc/{pid}/stat"), *children_stats(pid)]:
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
        except (OSError, IndexError):
            continue  # a child that just ended
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICK  # utime, stime
    return total


def children_stats(pid: int) -> list[Path]:
    try:
        return [Path(f"/proc/{child}/stat") for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass  # a kernel without CONFIG_PROC_CHILDREN: look for processes whose parent is `pid`
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:  # field 4: ppid
                    found.append(entry / "stat")
            except (OSError, IndexError, ValueError):
                continue
    return found


def threads_for(limit: int, cpus: int, others: float) -> int:
    """The CPUs others leave (a CPU is taken from half of it up), from 1 to `limit`."""
    return max(1, min(limit, cpus - math.floor(others + 0.5)))


class ThreadGovernor:
    """Call `poll()` after every step: /proc is read once per window, a change needs two windows running."""

    def __init__(
        self,
        limit: int,
        cpus: int,
        window_s: float = 2.0,
        warm_up_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        busy: Callable[[], Optional[float]] = machine_busy_seconds,
        own: Callable[[], float] = own_busy_seconds,
    ):
        self.limit, self.cpus, self.window_s = limit, cpus, window_s
        self.clock, self.busy, self.own = clock, busy, own
        self.threads = limit
        self.pending: Optional[int] = None  # the count the last window asked for, awaiting a second
        self.next_at = clock() + warm_up_s  # a short run (every test) never adjusts
        self.mark: Optional[tuple[float, float, float]] = None

    def poll(self) -> None:
        now = self.clock()
        if now < self.next_at:
            return
        self.next_at = now + self.window_s
        busy = self.busy()
        if busy is None:  # not Linux: nothing to read, keep the count
            self.next_at = math.inf
            return
        mark, self.mark = self.mark, (now, busy, self.own())
        if mark is None:
            return
        others = max(0.0, (busy - mark[1]) - (self.mark[2] - mark[2])) / (now - mark[0])  # CPUs others kept busy
        wanted = threads_for(self.limit, self.cpus, others)
        if wanted == self.threads:
            self.pending = None
        elif wanted == self.pending:  # two windows in a row: change
            self.threads, self.pending = wanted, None
            torch.set_num_threads(wanted)
            log.info(
                f"Other processes keep {others:.1f} of {self.cpus} CPUs busy: training goes on with {wanted} thread(s) "
                "(trainer.threads=0 adapts; trainer.threads=N fixes the count)"
            )
        else:
            self.pending = wanted


def thread_governor(threads: int, device: torch.device) -> Optional[ThreadGovernor]:
    limit = torch.get_num_threads()
    if threads or device.type != "cpu" or limit < 2 or machine_busy_seconds() is None:
        return None
    return ThreadGovernor(limit, available_cpus())
