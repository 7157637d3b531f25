"""A run's torch thread count: fixed and kept on resume, or the cores others leave free (trainer.adapt_threads)."""
# fixed as oneDNN splits its sums by thread count (docs/speed.md#sharing-the-machine)

import contextlib
import logging
import math
import time
from typing import Optional

import psutil
import torch

from gan.device import available_cpus

log = logging.getLogger(__name__)

# psutil's per-CPU times that count as busy (a field a system lacks: 0); guest is already in user
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")


def machine_busy_seconds(cpus: Optional[set[int]] = None) -> Optional[float]:
    """All processes' busy CPU seconds on this process's CPUs; None where psutil cannot read them."""
    if cpus is None and hasattr(psutil.Process, "cpu_affinity"):
        cpus = set(psutil.Process().cpu_affinity())
    try:
        per_cpu = psutil.cpu_times(percpu=True)
    except (OSError, NotImplementedError):
        return None
    chosen = [times for cpu, times in enumerate(per_cpu) if cpus is None or cpu in cpus]
    return sum(getattr(times, field, 0.0) for times in chosen for field in BUSY_FIELDS)


def own_busy_seconds() -> float:  # CPU seconds of this process and its live children (DataLoader workers)
    me, total = psutil.Process(), 0.0
    for process in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a child that just ended
            total += sum(process.cpu_times()[:2])  # user, system
    return total


def threads_for(limit: int, cpus: int, others: float) -> int:  # the CPUs others leave (taken from half up), 1 to limit
    return max(1, min(limit, cpus - math.floor(others + 0.5)))


class ThreadGovernor:
    """`poll()` after every step: CPU times are read once per window, a change needs two windows running."""

    window_s, warm_up_s = 2.0, 10.0  # a short run (every test) never adjusts
    clock, busy, own = staticmethod(time.monotonic), staticmethod(machine_busy_seconds), staticmethod(own_busy_seconds)

    def __init__(self, limit: int, cpus: int):
        self.limit, self.cpus, self.threads = limit, cpus, limit
        self.pending: Optional[int] = None  # the count the last window asked for, awaiting a second
        self.next_at, self.mark = None, None  # the warm-up starts at the first poll; mark: (time, busy, own) at a read

    def poll(self) -> None:
        now = self.clock()
        self.next_at = now + self.warm_up_s if self.next_at is None else self.next_at
        if now < self.next_at:
            return
        busy = self.busy()
        self.next_at = now + self.window_s if busy is not None else math.inf  # None: psutil cannot read the CPUs
        mark, self.mark = self.mark, (now, busy, self.own())
        if mark is None or busy is None:
            return
        others = max(0.0, (busy - mark[1]) - (self.mark[2] - mark[2])) / (now - mark[0])  # CPUs others kept busy
        wanted = threads_for(self.limit, self.cpus, others)
        if wanted != self.threads and wanted == self.pending:  # two windows in a row: change
            self.threads = wanted
            torch.set_num_threads(wanted)
            log.info(
                f"Other processes keep {others:.1f} of {self.cpus} CPUs busy: training goes on with {wanted} thread(s) "
                "(trainer.adapt_threads=true; without it the count stays fixed and the run bit-exact)"
            )
        self.pending = None if wanted == self.threads else wanted


def thread_governor(adapt: bool, device: torch.device) -> Optional[ThreadGovernor]:
    limit = torch.get_num_threads()
    if not adapt or device.type != "cpu" or limit < 2:
        return None
    if machine_busy_seconds() is None:
        log.info("trainer.adapt_threads: this system's CPU times cannot be read; training keeps %d thread(s).", limit)
        return None
    return ThreadGovernor(limit, available_cpus())


def keep_thread_count(recorded: Optional[int], threads: int, adapt: bool) -> None:
    """On resume: the run's count, unless trainer.threads=N or adapt_threads; at most this process's CPUs."""
    if recorded is None or adapt or recorded == torch.get_num_threads():
        return
    if not threads:  # more than this process's CPUs can only be slower, and at 100s crash torch's pool
        torch.set_num_threads(min(recorded, available_cpus()))
    if (now := torch.get_num_threads()) != recorded:
        why = f"trainer.threads={threads}" if threads else f"{now} CPU(s) usable here"
        log.warning(
            f"The run computed with {recorded} torch thread(s) and resumes with {now} ({why}): not bit "
            "for bit an uninterrupted run, as oneDNN splits its sums by thread count."
        )
