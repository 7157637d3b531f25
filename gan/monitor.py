"""What a person watching the run sees: TensorBoard events, a progress bar and the log file.

Owns the SummaryWriter (always with an explicit log_dir: without one it writes to ./runs), the tqdm
bar, and the conversion of on-device diagnostics to Python numbers, which happens here and only at
log time because each `.item()` waits for the device.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping

from torch import Tensor
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

log = logging.getLogger(__name__)


class Monitor:
    """TensorBoard + progress bar + log lines for one run, starting at `start_step`."""

    def __init__(self, run_dir: Path, start_step: int, max_steps: int, progress: bool = True,
                 enabled: bool = True):
        """enabled=False (ranks other than 0 of a DDP job): nothing is written, shown or logged."""
        self.enabled = enabled
        # purge_step: after a resume, events the interrupted run wrote after the checkpoint's step
        # (steps >= purge_step) are hidden, so TensorBoard shows one curve, not a doubled stretch.
        purge_step = start_step + 1 if start_step else None
        self.writer = SummaryWriter(log_dir=str(run_dir / "tb"), purge_step=purge_step) if enabled else None
        self.bar = tqdm(total=max_steps, initial=start_step, disable=not (progress and enabled), dynamic_ncols=True,
                        desc="train", unit="step")

    def scalars(self, step: int, stats: Mapping[str, Tensor | float]) -> dict[str, float]:
        """Write scalars, refresh the bar and log one line; returns the values as floats."""
        values = {tag: float(value) for tag, value in stats.items()}  # float(t) = t.item(): a host sync
        if not self.enabled:
            return values
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        short = {"d": values.get("loss/d"), "g": values.get("loss/g"),
                 "D(x)": values.get("d/real"), "D(G(z))": values.get("d/fake")}
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
        self.writer.add_image(tag, grid, step)

    def advance(self, steps: int = 1) -> None:
        self.bar.update(steps)

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
