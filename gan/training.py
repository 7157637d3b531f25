"""The training loop: builds every object from the typed config, then runs the sections in order.

Owns cadence (when to log, sample and checkpoint), what a checkpoint contains, resuming, and
stopping cleanly on SIGINT/SIGTERM or a non-finite loss. The per-network math lives in
`gan.steps`, the losses in `gan.losses`; this file only wires them together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Optional

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torchvision.utils import save_image

from gan.checkpoint import keep_numbered, load_checkpoint, load_module_state, save_checkpoint
from gan.config import OnNonFinite, Precision, TrainConfig, to_plain
from gan.data import BatchStream, load_dataset
from gan.device import resolve_device
from gan.losses import LOSSES
from gan.models import Discriminator, Generator
from gan.monitor import Monitor
from gan.sampling import image_grid, sample
from gan.steps import d_step, g_step

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """A loss became NaN or infinite; the message names the step and the losses."""


@dataclasses.dataclass
class TrainResult:
    step: int  # generator updates done, in this run and the runs it resumed
    metrics: dict[str, float]  # the last logged scalars
    checkpoint: Path  # checkpoints/last.pt
    stopped_by: Optional[str] = None  # "SIGINT"/"SIGTERM" when a signal ended the run early


def train(cfg: TrainConfig, run_dir: Path) -> TrainResult:
    """Train (or resume, if cfg.trainer.resume is set) one run, writing everything into run_dir."""
    trainer = cfg.trainer
    device = setup_torch(cfg)
    last_checkpoint = run_dir / "checkpoints" / "last.pt"
    samples_dir = run_dir / "samples"
    samples_dir.mkdir(parents=True, exist_ok=True)
    # read the checkpoint to resume from before any work, so a bad path fails at once
    resume_state = load_checkpoint(trainer.resume, map_location=device) if trainer.resume else None

    # data
    dataset = load_dataset(cfg.data)
    batches = BatchStream(dataset.images, cfg.data.batch_size, trainer.seed, device, cfg.data.num_workers)

    # models, optimizers, loss
    G, D = build_models(cfg, device)
    G_ema = build_ema(G, cfg.model.ema_decay)
    opt_g, opt_d = build_optimizer(G, cfg), build_optimizer(D, cfg)
    loss = LOSSES[cfg.loss.name.value]
    autocast = autocast_factory(trainer.precision, device)
    # One latent batch for the whole run, made directly on the device: every sample grid shows the
    # same z, so grids are comparable across steps (and across a resume: it is checkpointed).
    fixed_z = torch.randn(trainer.num_fixed_samples, cfg.model.z_dim, device=device,
                          generator=torch.Generator(device).manual_seed(trainer.seed))
    objects = dict(G=G, D=D, G_ema=G_ema, opt_g=opt_g, opt_d=opt_d, batches=batches)
    step = 0
    if resume_state is not None:
        step, fixed_z = restore(resume_state, **objects), resume_state["fixed_z"].to(device)
        log.info("Resumed from %s at step %d", trainer.resume, step)

    monitor = Monitor(run_dir, step, trainer.max_steps, progress=trainer.progress)
    watch = NonFiniteWatch(device)
    skip_nonfinite = trainer.on_nan == OnNonFinite.skip
    metrics: dict[str, float] = {}
    images_since, time_since = 0, time.perf_counter()
    try:
        with stop_on_signals() as stop:
            while step < trainer.max_steps:
                # fetch: a real batch, and latents created on the device (not on the CPU, then moved)
                real = next(batches)
                z = torch.randn(real.size(0), cfg.model.z_dim, device=device)
                with autocast():
                    fake = G(z)

                # (1) D step, on fake.detach()
                d_stats, real_features = d_step(D, opt_d, loss, real, fake, autocast, skip_nonfinite)
                # (2) G step, with D frozen
                g_stats = g_step(D, G, opt_g, loss, fake, real_features, cfg.loss.feature_matching,
                                 cfg.loss.backward_mode, autocast, skip_nonfinite)
                step += 1
                watch.update(step, d_stats["loss/d"], g_stats["loss/g"])

                # EMA of G's weights (and BatchNorm statistics), used for every sample
                if G_ema is not None:
                    G_ema.update_parameters(G)
                images_since += real.size(0)
                monitor.advance()
                done = step == trainer.max_steps or stop.signal is not None

                # log: the only place numbers leave the device
                if step % trainer.log_every == 0 or done:
                    if not skip_nonfinite:
                        watch.check()
                    rate = images_since / (time.perf_counter() - time_since)
                    metrics = monitor.scalars(step, {**d_stats, **g_stats, "perf/img_per_s": rate})
                    images_since, time_since = 0, time.perf_counter()

                # sample: the fixed latents through the EMA generator, in eval mode
                if step % trainer.sample_every == 0 or done:
                    grid = image_grid(sample(sampling_generator(G, G_ema), fixed_z))
                    save_image(grid, samples_dir / f"step_{step:06d}.png")
                    monitor.image("samples", grid, step)

                # checkpoint: never over the last good one with weights a NaN has reached
                if step % trainer.checkpoint_every == 0 or done:
                    if not skip_nonfinite:
                        watch.check()
                    state = checkpoint_state(cfg, step, fixed_z=fixed_z, **objects)
                    save_checkpoint(state, last_checkpoint)
                    keep_numbered(last_checkpoint, step, trainer.keep_checkpoints)
                if done:  # a signal that lands after `done` was computed gets one more step
                    break
        monitor.hparams(hparams_of(cfg), metrics)
    finally:
        monitor.close()
    return TrainResult(step, metrics, last_checkpoint, stop.signal)


def setup_torch(cfg: TrainConfig) -> torch.device:
    """Threads, determinism and seeds; returns the device to train on."""
    trainer = cfg.trainer
    if trainer.threads:
        torch.set_num_threads(trainer.threads)
    device = resolve_device(trainer.device)
    if trainer.deterministic:
        # cuDNN picks among algorithms, some with non-deterministic atomics, and cuBLAS needs a
        # fixed workspace; on the CPU every kernel used here is deterministic already.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = device.type == "cuda" and not trainer.deterministic
    seed_everything(trainer.seed)
    return device


def build_models(cfg: TrainConfig, device: torch.device) -> tuple[Generator, Discriminator]:
    """G and D on `device`; channels_last if configured (a layout change, not a numerical one)."""
    G = Generator(cfg.model.z_dim, cfg.model.g_width, cfg.data.channels, cfg.data.image_size)
    D = Discriminator(cfg.model.d_width, cfg.data.channels, cfg.data.image_size)
    memory_format = torch.channels_last if cfg.trainer.channels_last else torch.contiguous_format
    return G.to(device, memory_format=memory_format), D.to(device, memory_format=memory_format)


def build_ema(G: nn.Module, decay: float) -> Optional[AveragedModel]:
    """An exponential moving average of G, or None when decay is 0.

    use_buffers=True averages BatchNorm's running statistics along with the weights, so the
    averaged G normalises with statistics that belong to its averaged weights.
    """
    if decay == 0:
        return None
    return AveragedModel(G, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)


def sampling_generator(G: nn.Module, G_ema: Optional[AveragedModel]) -> nn.Module:
    """The network to draw samples from: the EMA generator when there is one."""
    return G_ema.module if G_ema is not None else G


def build_optimizer(module: nn.Module, cfg: TrainConfig) -> torch.optim.Adam:
    # foreach: one kernel launch per group of tensors instead of one per parameter.
    return torch.optim.Adam(module.parameters(), lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                            foreach=True)


def autocast_factory(precision: Precision, device: torch.device) -> Callable[[], ContextManager]:
    """A zero-argument callable returning the autocast context for forward passes."""
    if precision == Precision.fp32:
        return contextlib.nullcontext
    return functools.partial(torch.autocast, device_type=device.type, dtype=torch.bfloat16)


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

    def check(self) -> None:
        step = int(self.first_step)
        if step >= 0:
            loss_d, loss_g = self.losses.tolist()
            raise NonFiniteLossError(
                f"Non-finite loss at step {step}: loss/d={loss_d}, loss/g={loss_g}. Training stopped; "
                "checkpoints/last.pt still holds the last checkpoint written before it. Lower optim.lr, "
                "try loss=hinge, or set trainer.on_nan=skip to drop such steps.")


def checkpoint_state(cfg: TrainConfig, step: int, G: nn.Module, D: nn.Module,
                     G_ema: Optional[AveragedModel], opt_g: torch.optim.Optimizer,
                     opt_d: torch.optim.Optimizer, batches: BatchStream, fixed_z: Tensor) -> dict[str, Any]:
    """Everything needed to continue as if never stopped, as tensors and plain containers."""
    return {
        "G": G.state_dict(), "D": D.state_dict(),
        "G_ema": G_ema.state_dict() if G_ema is not None else None,
        "opt_g": opt_g.state_dict(), "opt_d": opt_d.state_dict(),
        "step": step, "data": batches.state_dict(), "fixed_z": fixed_z,
        "rng": {"python": random.getstate(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "config": to_plain(cfg),
    }


def restore(state: dict[str, Any], G: nn.Module, D: nn.Module, G_ema: Optional[AveragedModel],
            opt_g: torch.optim.Optimizer, opt_d: torch.optim.Optimizer, batches: BatchStream) -> int:
    """Load a checkpoint's state into freshly built objects; returns its step."""
    load_module_state(G, state["G"], "generator")
    load_module_state(D, state["D"], "discriminator")
    if G_ema is not None and state.get("G_ema") is not None:
        load_module_state(G_ema, state["G_ema"], "EMA generator")
    elif G_ema is not None:  # a run without EMA continues with one: start it from G
        G_ema.n_averaged.zero_()
        G_ema.update_parameters(G)
    opt_g.load_state_dict(state["opt_g"])
    opt_d.load_state_dict(state["opt_d"])
    batches.load_state_dict(state["data"])
    random.setstate(state["rng"]["python"])
    torch.set_rng_state(state["rng"]["torch"].cpu())
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["rng"]["cuda"]])
    return int(state["step"])


def seed_everything(seed: int) -> None:
    """Seed Python's and torch's global generators (this project draws nothing from numpy)."""
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def hparams_of(cfg: TrainConfig) -> dict[str, int | float | str | bool]:
    """The config flattened to 'group.key' -> scalar, as TensorBoard's hparams accept."""
    flat = {}
    for group, values in to_plain(cfg).items():
        for key, value in values.items():
            flat[f"{group}.{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


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
