"""trainer.adapt_threads=true: the cores others leave free, on a fake clock and on psutil's readings."""

from __future__ import annotations

import logging
import time
from collections import namedtuple
from unittest.mock import Mock

import pytest
import torch
from conftest import compose_config
from test_watching import events_of

from gan.training import loop, train
from gan.training import threads as T
from gan.training.threads import ThreadGovernor, thread_governor, threads_for


class Machine:
    """A fake clock and CPU counters: `others` and `ours` are the cores each keeps busy from now on."""

    def __init__(self):
        self.t, self.busy, self.own, self.calls = 0.0, 0.0, 0.0, []
        self.others, self.ours = 0.0, 2.0

    def run(self, governor: ThreadGovernor, seconds: float, step: float = 0.1) -> None:
        for _ in range(round(seconds / step)):
            self.t += step
            self.busy += (self.others + self.ours) * step
            self.own += self.ours * step
            governor.poll()


def test_threads_step_down_while_others_are_busy_and_back_when_they_leave(monkeypatch):
    # a CPU counts as taken from half busy, and one thread is always left
    assert [threads_for(2, 2, busy) for busy in (0.0, 0.4, 0.6, 1.4, 1.6, 5.0)] == [2, 2, 1, 1, 1, 1]
    assert [threads_for(8, 8, busy) for busy in (0.0, 2.5, 3.4, 7.9)] == [8, 5, 5, 1]
    # 2 threads of 4 CPUs (OMP_NUM_THREADS=2, or one of two torchrun ranks): free CPUs to spare
    assert [threads_for(2, 4, busy) for busy in (0.0, 2.0, 2.6, 3.6)] == [2, 2, 1, 1]
    machine, reads, governor = Machine(), [], ThreadGovernor(2, 2)
    monkeypatch.setattr(T.torch, "set_num_threads", machine.calls.append)  # record, leave this process alone
    governor.clock, governor.own = lambda: machine.t, lambda: machine.own
    governor.busy = lambda: reads.append(1) or machine.busy
    machine.run(governor, 9.9)
    assert reads == []  # every short run (the whole test suite) trains exactly as with a fixed count
    machine.run(governor, 2.1)
    machine.others = 1.5
    machine.run(governor, 2.0)  # one window only: a short burst changes nothing
    machine.others, machine.ours = 0.0, 3.0  # this process with its DataLoader workers: not "others"
    machine.run(governor, 20)
    assert reads and governor.threads == 2 and machine.calls == []
    machine.others, machine.ours = 1.0, 1.0  # a neighbour takes a core
    machine.run(governor, 3)  # one window saw it: not yet (a burst must last two)
    assert governor.threads == 2
    machine.run(governor, 3)
    assert governor.threads == 1 and machine.calls == [1]
    machine.others = 0.0  # it ends
    machine.run(governor, 6)
    assert governor.threads == 2 and machine.calls == [1, 2]


def test_the_governor_is_made_only_when_asked_on_a_cpu_with_cores_to_share(monkeypatch, caplog):
    busy, own = T.machine_busy_seconds(), T.own_busy_seconds()  # the real counters see this process work
    end = time.process_time() + 0.3
    while time.process_time() < end:  # 0.3 s of CPU in this process
        pass
    assert T.own_busy_seconds() - own >= 0.2 and T.machine_busy_seconds() - busy >= 0.2
    assert T.machine_busy_seconds(cpus=set()) == 0.0  # no CPUs of ours: nothing to count
    cpu = torch.device("cpu")
    assert thread_governor(False, cpu) is None and thread_governor(True, torch.device("meta")) is None
    made = thread_governor(True, cpu)
    assert (made is not None) == (torch.get_num_threads() >= 2 and T.machine_busy_seconds() is not None)
    monkeypatch.setattr(T.psutil, "cpu_times", Mock(side_effect=NotImplementedError))
    monkeypatch.setattr(T.torch, "get_num_threads", lambda: 4)
    with caplog.at_level(logging.INFO, logger=T.__name__):  # without readable CPU times the count stays, and says so
        assert T.machine_busy_seconds() is None and thread_governor(True, cpu) is None
    (said,) = caplog.messages
    assert said == "trainer.adapt_threads: this system's CPU times cannot be read; training keeps 4 thread(s)."


# psutil's per-CPU readings as each system names its fields
LINUX = namedtuple("scputimes", "user nice system idle iowait irq softirq steal guest guest_nice")
MACOS = namedtuple("scputimes", "user nice system idle")
WINDOWS = namedtuple("scputimes", "user system idle interrupt dpc")


@pytest.mark.parametrize(
    "readings, busy",
    [
        # guest time is already in user: counted once; idle and iowait are not busy
        ([LINUX(1.0, 0.5, 2.0, 90.0, 5.0, 0.25, 0.25, 0.5, 1.0, 0.0), LINUX(3.0, 0, 1.0, 50.0, 0, 0, 0, 0, 0, 0)], 8.5),
        ([MACOS(1.0, 0.5, 2.0, 100.0), MACOS(3.0, 0.0, 1.0, 50.0)], 7.5),
        ([WINDOWS(1.0, 2.0, 99.0, 0.25, 0.25), WINDOWS(3.0, 1.0, 50.0, 0.0, 0.0)], 7.0),
    ],
    ids=["linux", "macos", "windows"],
)
def test_busy_seconds_are_read_through_psutil_on_each_system(monkeypatch, readings, busy):
    monkeypatch.setattr(T.psutil, "cpu_times", lambda percpu: readings)
    assert T.machine_busy_seconds(cpus={0, 1}) == busy
    assert T.machine_busy_seconds(cpus={1}) == sum(getattr(readings[1], f, 0.0) for f in T.BUSY_FIELDS)
    monkeypatch.delattr(T.psutil.Process, "cpu_affinity", raising=False)  # macOS sets no affinity: every CPU
    assert T.machine_busy_seconds() == busy


def test_the_thread_count_is_drawn_at_every_log_point_with_its_change(tmp_path, monkeypatch):
    calls, tick = [], {"t": 0.0, "busy": 0.0}
    monkeypatch.setattr(T.torch, "set_num_threads", calls.append)

    def clock() -> float:  # every poll is a new window in which others kept 1.5 cores busy
        tick["t"], tick["busy"] = tick["t"] + 1.0, tick["busy"] + 1.5
        return tick["t"]

    governor = ThreadGovernor(2, 2)  # made whatever this machine's thread count
    governor.window_s, governor.warm_up_s, governor.clock = 0.5, 0.0, clock
    governor.busy, governor.own = lambda: tick["busy"], lambda: 0.0
    monkeypatch.setattr(loop, "thread_governor", lambda adapt, device: governor)
    train(compose_config("trainer.max_steps=6", "trainer.threads=0", "trainer.adapt_threads=true"), tmp_path / "run")
    drawn = [(e.step, e.value) for e in events_of(tmp_path / "run" / "tb").Scalars("time/threads")]
    # marks at polls 1, 2; windows at 2, 3 agree: the change comes at step 3; the count is drawn at
    # every log point (trainer.log_every=2), a line rather than one dot per change
    assert calls == [1] and drawn == [(2, 2.0), (4, 1.0), (6, 1.0)]
