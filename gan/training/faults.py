"""Faults the loop survives without losing work: non-finite losses or weights, signals, a model too large."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import torch
from torch import Tensor, nn
from torch.nn.utils import get_total_norm

from gan.checkpoint import load_checkpoint, nonfinite
from gan.config import TrainConfig
from gan.errors import CheckpointError
from gan.training.state import TrainingState

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError): ...  # a loss became NaN or infinite


class NonFiniteWeightsError(NonFiniteLossError): ...  # non-finite weights or Adam moments: the same exit code


class NonFiniteWatch:
    """The first step whose loss was NaN or inf, kept on the device: update() never syncs, check() does."""

    def __init__(self, device: torch.device, checkpoint: Path, cfg: TrainConfig):
        self.first_step = torch.full((), -1, dtype=torch.long, device=device)
        self.losses, self.checkpoint, self.cfg = torch.zeros(2, device=device), checkpoint, cfg

    def update(self, step: int, loss_d: Tensor, loss_g: Tensor) -> None:
        losses = torch.stack([loss_d.float(), loss_g.float()])
        first = (~torch.isfinite(losses).all()) & (self.first_step < 0)
        self.first_step = torch.where(first, step, self.first_step)
        self.losses = torch.where(first, losses, self.losses)

    def check(self, skipping: bool = False) -> None:
        if skipping or (step := int(self.first_step)) < 0:
            return
        (loss_d, loss_g), optim = self.losses.tolist(), self.cfg.optim
        rates = f"Lower optim.lr (set to {optim.lr:g}: the step size of G and D)"
        if optim.lr_d is not None:
            rates = f"Lower optim.lr (set to {optim.lr:g}: G's step size) or optim.lr_d (set to {optim.lr_d:g}: D's)"
        hinge = "" if self.cfg.loss.name == "hinge" else ", try loss=hinge"
        raise NonFiniteLossError(
            f"Non-finite loss at step {step}: loss/d={loss_d}, loss/g={loss_g}. No checkpoint was written from these "
            f"weights; {_kept(self.checkpoint)} {rates}{hinge}, or set trainer.on_nan=skip to drop such steps."
        )


def check_finite_state(state: TrainingState, kept: Path) -> None:
    """A finite loss can still leave inf in weights or Adam's moments (a huge gradient squared)."""
    parts = {name: getattr(state, name) for name in ("G", "D", "G_ema", "opt_g", "opt_d")}
    parts = {name: part for name, part in parts.items() if part is not None}  # G_ema: None without an EMA
    modules = {name: part for name, part in parts.items() if isinstance(part, nn.Module)}
    names = {id(p): f"{name}.{key}" for name, module in modules.items() for key, p in module.named_parameters()}
    named = [((name, key), t) for name, module in modules.items() for key, t in module.state_dict().items()]
    moments = [(n, p, k, v) for n in ("opt_g", "opt_d") for p, m in parts[n].state.items() for k, v in m.items()]
    named += [((n, f"{k} of {names.get(id(p), 'a parameter')}"), v) for n, p, k, v in moments]  # 'exp_avg of D.x'
    bad, _ = nonfinite(named)  # one host sync while all is finite
    found = []
    for name in parts:
        if keys := [key for part, key in bad if part == name]:
            total = sum(1 for (part, _), t in named if part == name and isinstance(t, Tensor) and t.is_floating_point())
            shown = ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")
            found.append(f"{name} in {len(keys)} of its {total} tensors ({shown})")
    if found:
        raise NonFiniteWeightsError(
            f"Non-finite weights at step {state.step}: {'; '.join(found)}. No checkpoint was written; {_kept(kept)} "
            "trainer.on_nan=skip cannot help (the weights are non-finite, not only a step's loss). Lower optim.lr or "
            "optim.lr_d (a resume may change them), or try loss=hinge."
        )
    for name, module in modules.items():
        largest = float(get_total_norm([p.detach() for p in module.parameters()], math.inf))  # the inf-norm
        if largest > 1e4:
            log.warning(
                "Step %d: %s's weights have diverged (largest |weight| %.3g, where DCGAN's start near 0.02 and 1). "
                "The checkpoint is still written; lower optim.lr or optim.lr_d (a resume may change them).",
                state.step, name, largest,
            )  # fmt: skip


def _kept(path: Path) -> str:
    if not path.is_file():
        return f"this run had written none yet ({path} does not exist)."
    try:
        return f"{path} keeps step {int(load_checkpoint(path)['step'])}, the last good one."
    except CheckpointError:
        return f"{path} is left as it was."


@contextlib.contextmanager
def stop_on_signals() -> Iterator[SimpleNamespace]:
    """A flag instead of death, so the loop can checkpoint; a second SIGINT interrupts at once."""
    flag = SimpleNamespace(reason=None)  # the signal's name, or "d_won"

    def handler(signum: int, frame: Any) -> None:
        if flag.reason in ("SIGINT", "SIGTERM") and signum == signal.SIGINT:  # a second signal
            raise KeyboardInterrupt
        flag.reason = signal.Signals(signum).name
        log.warning("%s received: finishing this step, then writing a checkpoint.", flag.reason)

    # the signal SLURM sends a submitit job before its time limit, handed on to submitit's handler
    handed_on = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
    usable = isinstance(handed_on, signal.Signals) and handed_on not in (signal.SIGINT, signal.SIGTERM)
    if "SUBMITIT_EXECUTOR" not in os.environ or not usable or not callable(signal.getsignal(handed_on)):
        handed_on = None
    main = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
    signals = (signal.SIGINT, signal.SIGTERM, *([handed_on] if handed_on else [])) if main else ()
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if handed_on is not None and flag.reason == handed_on.name:  # only when the block ended normally
        log.info("Checkpoint written; %s passed on to submitit, which requeues the job.", flag.reason)
        previous[handed_on](handed_on, None)
