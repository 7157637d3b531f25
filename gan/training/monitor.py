"""What a person watching the run sees: TensorBoard events, a progress bar and the log file.

Owns the SummaryWriter (always with an explicit log_dir: without one it writes to ./runs), the tqdm
bar, and the conversion of on-device diagnostics to Python numbers, which happens here and only at
log time because each `.item()` waits for the device.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import TracebackType
from typing import Mapping, Optional

from torch import Tensor
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

log = logging.getLogger(__name__)


class Monitor:
    """TensorBoard + progress bar + log lines for one run, starting at `start_step`."""

    def __init__(self, run_dir: Path, start_step: int, max_steps: int, progress: bool = True, enabled: bool = True):
        """enabled=False (ranks other than 0 of a DDP job): nothing is written, shown or logged."""
        self.enabled = enabled
        # purge_step: after a resume, events the interrupted run wrote after the checkpoint's step
        # (steps >= purge_step) are hidden, so TensorBoard shows one curve, not a doubled stretch.
        purge_step = start_step + 1 if start_step else None
        self.writer = SummaryWriter(log_dir=str(run_dir / "tb"), purge_step=purge_step) if enabled else None
        self.bar = tqdm(
            total=max_steps,
            initial=start_step,
            disable=not (progress and enabled),
            dynamic_ncols=True,
            desc="train",
            unit="step",
        )
        # throughput: images since the last log line, and the wall time of the loop after its first
        # step (which may include compiling, so it is reported apart as perf/first_step_s)
        self.images_since, self.time_since = 0, time.perf_counter()
        self.first_step_done: Optional[float] = None

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, kind: Optional[type], error: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.close()

    @property
    def seconds(self) -> float:
        """Wall time since the first step ended (0 before it)."""
        return time.perf_counter() - self.first_step_done if self.first_step_done else 0.0

    def advance(self, step: int, images: int) -> None:
        """Step `step` done, on `images` images (all ranks together)."""
        self.bar.update(1)
        self.images_since += images
        if self.first_step_done is None:
            self.first_step_done = time.perf_counter()
            self.note("perf/first_step_s", self.first_step_done - self.time_since, step)

    def scalars(self, step: int, stats: Mapping[str, Tensor | float]) -> dict[str, float]:
        """Write scalars and perf/img_per_s, refresh the bar and log one line; returns the values as floats."""
        values = {tag: float(value) for tag, value in stats.items()}  # float(t) = t.item(): a host sync
        now = time.perf_counter()
        values["perf/img_per_s"] = self.images_since / (now - self.time_since)
        self.images_since, self.time_since = 0, now
        if not self.enabled:
            return values
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        short = {
            "d": values.get("loss/d"),
            "g": values.get("loss/g"),
            "D(x)": values.get("d/real"),
            "D(G(z))": values.get("d/fake"),
        }
        self.bar.set_postfix({k: f"{v:.3f}" for k, v in short.items() if v is not None}, refresh=False)
        log.info("step %d  %s", step, "  ".join(f"{tag}={value:.4g}" for tag, value in values.items()))
        return values

    def note(self, tag: str, value: float, step: int) -> None:
        """One extra scalar with a log line (e.g. the first interval's time, compiling included)."""
        if not self.enabled:
            return
        self.writer.add_scalar(tag, value, step)
        log.info("step %d  %s=%.4g", step, tag, value)

    def image(self, tag: str, grid: Tensor, step: int) -> None:
        if self.enabled:
            self.writer.add_image(tag, grid, step)

    def hparams(self, hparams: Mapping[str, int | float | str | bool], metrics: Mapping[str, float]) -> None:
        """The run's settings next to its final scalars, in TensorBoard's HPARAMS tab.

        run_name='.' writes into this run instead of a new time-named sub-run.
        """
        if not self.enabled:
            return
        self.writer.add_hparams(dict(hparams), {f"final/{k}": v for k, v in metrics.items()}, run_name=".")

    def close(self) -> None:
        self.bar.close()
        if self.writer is not None:
            self.writer.close()  # flushes: events are unreadable before flush()/close()
