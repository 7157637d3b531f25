"""What train() does besides its steps and the EMA, behind one call (loop.py:periodic_extras lists it all), as
StyleGAN2-ADA hangs snapshots off a tick."""

import dataclasses
from typing import Callable, Iterable, Mapping

from torch import Tensor


@dataclasses.dataclass(frozen=True)
class Tick:
    step: int  # generator updates done, this iteration's included
    stats: Mapping[str, Tensor]  # both steps' diagnostics, 0-dim tensors still on the device
    images: int  # real images the iteration consumed, all ranks together
    done: bool  # the run ends with this iteration


@dataclasses.dataclass(frozen=True)
class Every:
    """`run(tick)` after every `steps`-th iteration (0: never), and after the last when `at_end`."""

    name: str
    steps: int
    run: Callable[[Tick], None]
    at_end: bool = False


class Extras:
    def __init__(self, tasks: Iterable[Every]):
        self.tasks = [task for task in tasks if task.steps > 0]
        names = [task.name for task in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"two periodic extras share a name: {names}")

    def after_step(self, tick: Tick) -> None:
        for task in self.tasks:
            if tick.step % task.steps == 0 or (task.at_end and tick.done):
                task.run(tick)
