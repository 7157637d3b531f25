"""Faults the loop must survive without losing work: a non-finite loss, SIGINT and SIGTERM.

Owns how each is noticed (a NaN watch on the device without a per-step host sync; signal handlers
that set a flag) and how it is reported. What the loop then does (write a checkpoint, or not) is
decided in `gan.training.loop`.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Any, Iterator, Optional

import torch
from torch import Tensor

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """A loss became NaN or infinite; the message names the step and the losses."""


class NonFiniteWatch:
    """Remembers, on the device, the first step whose loss was NaN or inf, without a host sync.

    update() runs every step as tensor ops only; check() reads the result (one sync) and runs at
    log and checkpoint time, so no checkpoint is ever written from weights a NaN has reached.
    """

    def __init__(self, device: torch.device):
        self.first_step = torch.full((), -1, dtype=torch.long, device=device)
        self.losses = torch.zeros(2, device=device)

    def update(self, step: int, loss_d: Tensor, loss_g: Tensor) -> None:
        losses = torch.stack([loss_d.float(), loss_g.float()])
        first = (~torch.isfinite(losses).all()) & (self.first_step < 0)
        self.first_step = torch.where(first, step, self.first_step)
        self.losses = torch.where(first, losses, self.losses)

    def check(self, skipping: bool = False) -> None:
        """Raise NonFiniteLossError if a loss was ever non-finite; skipping=True (trainer.on_nan=skip:
        such steps were dropped) checks nothing."""
        if skipping:
            return
        step = int(self.first_step)
        if step >= 0:
            loss_d, loss_g = self.losses.tolist()
            raise NonFiniteLossError(
                f"Non-finite loss at step {step}: loss/d={loss_d}, loss/g={loss_g}. Training stopped; "
                "checkpoints/last.pt still holds the last checkpoint written before it. Lower optim.lr, "
                "try loss=hinge, or set trainer.on_nan=skip to drop such steps."
            )


class _StopFlag:
    signal: Optional[str] = None


@contextlib.contextmanager
def stop_on_signals() -> Iterator[_StopFlag]:
    """SIGINT/SIGTERM set a flag instead of killing the process, so the loop can finish its step,
    write a checkpoint and close TensorBoard. A second SIGINT interrupts at once (KeyboardInterrupt).
    Signals can only be handled in the main thread; elsewhere the block runs unprotected.
    """
    flag = _StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum: int, frame: Any) -> None:
        if flag.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        flag.signal = signal.Signals(signum).name
        log.warning("%s received: finishing this step, then writing a checkpoint.", flag.signal)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
