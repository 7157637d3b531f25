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
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel
from torchvision.utils import save_image

from gan.checkpoint import keep_numbered, load_checkpoint, load_module_state, save_checkpoint
from gan.config import OnNonFinite, Precision, TrainConfig, to_plain
from gan.data import BatchStream, ImageSet, load_dataset
from gan.device import resolve_device, retain_freed_memory
from gan.distributed import SINGLE, World, any_rank, rank_device
from gan.losses import LOSSES, AdversarialLoss, d_loss_bce
from gan.models import Discriminator, Generator
from gan.monitor import Monitor
from gan.sampling import image_grid, sample
from gan.steps import Penalties, StepContext, d_step, g_step

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """A loss became NaN or infinite; the message names the step and the losses."""


@dataclasses.dataclass
class TrainResult:
    step: int  # generator updates done, in this run and the runs it resumed
    metrics: dict[str, float]  # the last logged scalars
    checkpoint: Path  # checkpoints/last.pt
    stopped_by: Optional[str] = None  # "SIGINT"/"SIGTERM" when a signal ended the run early
    seconds: float = 0.0  # wall time of the loop after its first step (which may include compiling)


def train(cfg: TrainConfig, run_dir: Path, dataset: Optional[ImageSet] = None,
          world: World = SINGLE) -> TrainResult:
    """Train (or resume, if cfg.trainer.resume is set) one run, writing everything into run_dir.

    `dataset` replaces the one cfg.data names (the benchmark feeds its own images this way).
    `world` is this process's place in a torchrun job; rank 0 alone writes files.
    """
    trainer = cfg.trainer
    device = setup_torch(cfg, world)
    last_checkpoint = run_dir / "checkpoints" / "last.pt"
    samples_dir = run_dir / "samples"
    if world.is_main:
        samples_dir.mkdir(parents=True, exist_ok=True)
    # read the checkpoint to resume from before any work, so a bad path fails at once
    resume_state = load_checkpoint(trainer.resume, map_location=device) if trainer.resume else None

    # data
    dataset = dataset or load_dataset(cfg.data)
    batches = BatchStream(dataset.images, cfg.data.batch_size, trainer.seed, device, cfg.data.num_workers,
                          world.rank, world.size)

    # models, optimizers, loss
    G, D = build_models(cfg, device)
    # a deep copy of G: made before compiling, it stays eager
    G_ema = build_ema(G, cfg.model.ema_decay, cfg.model.ema_kimg, cfg.model.ema_rampup,
                      images_per_step=cfg.data.batch_size * world.size)
    if trainer.compile:
        compile_models(G, D)
    G_train, D_train = wrap_for_ddp(G, D, world, device)
    opt_g, opt_d = build_optimizer(G, cfg, device), build_optimizer(D, cfg, device, lr=cfg.optim.lr_d)
    loss = build_loss(cfg)
    penalties = Penalties(cfg.loss.gradient_penalty, cfg.loss.r1)
    precision = resolve_precision(trainer.precision, device)
    ctx = step_context(precision, device, skip_nonfinite=trainer.on_nan == OnNonFinite.skip)
    log.info("Training on %s in %s%s, %d process(es)", device, precision.value,
             " (trainer.precision=auto)" if trainer.precision == Precision.auto else "", world.size)
    # One latent batch for the whole run, made directly on the device: every sample grid shows the
    # same z, so grids are comparable across steps (and across a resume: it is checkpointed).
    fixed_z = torch.randn(trainer.num_fixed_samples, cfg.model.z_dim, device=device,
                          generator=torch.Generator(device).manual_seed(trainer.seed))
    objects = dict(G=G, D=D, G_ema=G_ema, opt_g=opt_g, opt_d=opt_d, scaler=ctx.scaler, batches=batches)
    step = 0
    if resume_state is not None:
        step, fixed_z = restore(resume_state, **objects), resume_state["fixed_z"].to(device)
        log.info("Resumed from %s at step %d", trainer.resume, step)

    monitor = Monitor(run_dir, step, trainer.max_steps, progress=trainer.progress, enabled=world.is_main)
    watch = NonFiniteWatch(device)
    metrics: dict[str, float] = {}
    images_since, time_since = 0, time.perf_counter()
    first_step_done: Optional[float] = None
    try:
        with stop_on_signals() as stop:
            while step < trainer.max_steps:
                # fetch: a real batch, and latents created on the device (not on the CPU, then moved)
                real = next(batches)
                z = torch.randn(real.size(0), cfg.model.z_dim, device=device)
                with ctx.autocast():
                    fake = G_train(z)

                # (1) D step, on fake.detach()
                d_stats, real_features = d_step(D_train, opt_d, loss, real, fake, ctx, penalties)
                # (2) G step, with D frozen. Under DDP the G step uses the unwrapped D: DDP's
                # reducer waits for a gradient of every D parameter after each wrapped forward, and
                # a frozen D makes none. G's own gradients are still averaged by G's wrapper.
                g_stats = g_step(D, G, opt_g, loss, fake, real_features, cfg.loss.feature_matching,
                                 cfg.loss.backward_mode, ctx)
                ctx.scaler.update()  # once per iteration, after both optimizers stepped (fp16 only)
                step += 1
                watch.update(step, d_stats["loss/d"], g_stats["loss/g"])

                # EMA of G's weights (and BatchNorm statistics), used for every sample
                if G_ema is not None:
                    G_ema.update_parameters(G)
                images_since += real.size(0)
                if first_step_done is None:  # the first step includes compiling (trainer.compile=true)
                    first_step_done = time.perf_counter()
                    monitor.note("perf/first_step_s", first_step_done - time_since, step)
                monitor.advance()
                done = step == trainer.max_steps or any_rank(stop.signal is not None, world, device)

                # log: the only place numbers leave the device
                if step % trainer.log_every == 0 or done:
                    if not ctx.skip_nonfinite:
                        watch.check()
                    rate = world.size * images_since / (time.perf_counter() - time_since)  # all ranks
                    metrics = monitor.scalars(step, {**d_stats, **g_stats, "perf/img_per_s": rate})
                    images_since, time_since = 0, time.perf_counter()

                # sample: the fixed latents through the EMA generator, in eval mode
                if world.is_main and (step % trainer.sample_every == 0 or done):
                    grid = image_grid(sample(sampling_generator(G, G_ema), fixed_z))
                    save_image(grid, samples_dir / f"step_{step:06d}.png")
                    monitor.image("samples", grid, step)

                # checkpoint: never over the last good one with weights a NaN has reached
                if world.is_main and (step % trainer.checkpoint_every == 0 or done):
                    if not ctx.skip_nonfinite:
                        watch.check()
                    state = checkpoint_state(cfg, step, fixed_z=fixed_z, **objects)
                    save_checkpoint(state, last_checkpoint)
                    keep_numbered(last_checkpoint, step, trainer.keep_checkpoints)
                if done:  # a signal that lands after `done` was computed gets one more step
                    break
        monitor.hparams(hparams_of(cfg), metrics)
    finally:
        monitor.close()
    seconds = time.perf_counter() - first_step_done if first_step_done else 0.0
    return TrainResult(step, metrics, last_checkpoint, stop.signal, seconds)


def setup_torch(cfg: TrainConfig, world: World = SINGLE) -> torch.device:
    """Threads, determinism and seeds; returns the device to train on."""
    trainer = cfg.trainer
    if trainer.threads:
        torch.set_num_threads(trainer.threads)
    device = rank_device(world, resolve_device(trainer.device))
    if device.type == "cpu" and trainer.retain_host_memory and retain_freed_memory():
        log.debug("glibc malloc: freed blocks are kept for reuse (trainer.retain_host_memory=true)")
    if trainer.deterministic:
        # cuDNN picks among algorithms, some with non-deterministic atomics, and cuBLAS needs a
        # fixed workspace; on the CPU every kernel used here is deterministic already.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = device.type == "cuda" and not trainer.deterministic
    # Each rank draws its own latents. Initial weights may differ too: DDP copies rank 0's into
    # every replica when it wraps the networks.
    seed_everything(trainer.seed + world.rank)
    return device


def build_models(cfg: TrainConfig, device: torch.device) -> tuple[Generator, Discriminator]:
    """G and D on `device`; channels_last if configured (a layout change, not a numerical one)."""
    G = Generator(cfg.model.z_dim, cfg.model.g_width, cfg.data.channels, cfg.data.image_size)
    D = Discriminator(cfg.model.d_width, cfg.data.channels, cfg.data.image_size, cfg.model.d_batchnorm,
                      cfg.model.spectral_norm, cfg.model.pack, cfg.model.minibatch_std)
    if cfg.model.sync_batchnorm:  # one set of batch statistics across all ranks of a DDP job
        G, D = nn.SyncBatchNorm.convert_sync_batchnorm(G), nn.SyncBatchNorm.convert_sync_batchnorm(D)
    memory_format = torch.channels_last if cfg.trainer.channels_last else torch.contiguous_format
    return G.to(device, memory_format=memory_format), D.to(device, memory_format=memory_format)


def wrap_for_ddp(G: nn.Module, D: nn.Module, world: World, device: torch.device) -> tuple[nn.Module, nn.Module]:
    """DistributedDataParallel wrappers for the forward passes whose gradients ranks must average.

    The wrappers share their parameters with G and D; optimizers, EMA, sampling and checkpoints use
    the plain modules, so a checkpoint holds unwrapped state dicts and loads with or without DDP.
    """
    if not world.distributed:
        return G, D
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(G, device_ids=device_ids), DistributedDataParallel(D, device_ids=device_ids)


# AveragedModel's multi_avg_fn: (averaged tensors, current tensors, updates so far) -> None, in place
EmaUpdate = Callable[[list[Tensor], list[Tensor], Tensor], None]


def build_ema(G: nn.Module, decay: float, kimg: float = 0.0, rampup: float = 0.0,
              images_per_step: int = 1) -> Optional[AveragedModel]:
    """An exponential moving average of G (torch's AveragedModel), or None when it is off.

    The decay is `decay` with TF's warm-up, or, when kimg > 0, a half-life of kimg thousand images
    as StyleGAN2-ADA states it (see ema_with_half_life). use_buffers=True averages BatchNorm's
    running statistics along with the weights; evaluate.py recomputes them for the averaged
    weights before it measures (bn_batches).
    """
    if kimg > 0:
        update = ema_with_half_life(kimg * 1000, rampup, images_per_step)
    elif decay > 0:
        update = ema_with_warmup(decay)
    else:
        return None
    return AveragedModel(G, multi_avg_fn=update, use_buffers=True)


def ema_with_warmup(decay: float) -> EmaUpdate:
    """EMA update whose decay warms up as in TF's ExponentialMovingAverage(num_updates):
    min(decay, (1 + n) / (10 + n)) after n updates. With a fixed 0.999 the first few hundred
    steps' samples would still be mostly the random initial weights (0.999^300 = 74%).
    The decay is a 0-dim tensor on the device: no host sync per step.
    """
    return _ema_update(lambda n: ((1 + n) / (10 + n)).clamp(max=decay))


def ema_with_half_life(half_life_images: float, rampup: float,
                       images_per_step: int) -> EmaUpdate:
    """EMA update with a half-life counted in images (StyleGAN2-ADA, training_loop.py): the decay
    per step is 0.5 ** (images_per_step / half-life), so the average spans the same images
    whatever the batch size; with rampup > 0 the half-life is at most rampup x the images seen
    so far, which plays the part of the warm-up above.
    """

    def decay(n: Tensor) -> Tensor:
        half_life = torch.full_like(n, half_life_images, dtype=torch.float32)
        if rampup > 0:
            half_life = torch.minimum(half_life, rampup * (n.float() + 1) * images_per_step)
        return 0.5 ** (images_per_step / half_life)

    return _ema_update(decay)


def _ema_update(decay_after: Callable[[Tensor], Tensor]) -> EmaUpdate:
    """AveragedModel's multi_avg_fn: averaged = decay * averaged + (1 - decay) * current, with the
    decay a function of the number of updates so far (a 0-dim tensor on the device)."""

    @torch.no_grad()
    def update(averaged: list[Tensor], current: list[Tensor], num_averaged: Tensor) -> None:
        if not averaged[0].is_floating_point():  # BatchNorm's num_batches_tracked: just follow G
            torch._foreach_copy_(averaged, current)
            return
        decay = decay_after(num_averaged).to(averaged[0].dtype)
        torch._foreach_lerp_(averaged, current, 1 - decay)

    return update


def sampling_generator(G: nn.Module, G_ema: Optional[AveragedModel]) -> nn.Module:
    """The network to draw samples from: the EMA generator when there is one."""
    return G_ema.module if G_ema is not None else G


def build_optimizer(module: nn.Module, cfg: TrainConfig, device: torch.device,
                    lr: Optional[float] = None) -> torch.optim.Adam:
    # fused: the whole Adam update in one kernel (CPU and CUDA); elsewhere foreach, one launch per
    # group of tensors. Same math as the per-parameter loop, to float rounding.
    fused = device.type in ("cpu", "cuda")
    return torch.optim.Adam(module.parameters(), lr=lr or cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                            fused=fused or None, foreach=None if fused else True)


def build_loss(cfg: TrainConfig) -> AdversarialLoss:
    """The configured adversarial loss, with bce's real label (one-sided smoothing) bound in."""
    loss = LOSSES[cfg.loss.name.value]
    if cfg.loss.name.value == "bce" and cfg.loss.real_label != 1.0:
        return AdversarialLoss(functools.partial(d_loss_bce, real_label=cfg.loss.real_label), loss.g)
    return loss


def resolve_precision(precision: Precision, device: torch.device) -> Precision:
    """auto -> bf16 where the hardware has fast bf16 math, else fp32."""
    if precision != Precision.auto:
        return precision
    if device.type == "cuda":
        fast = torch.cuda.get_device_capability(device)[0] >= 8  # Ampere and later: bf16 tensor cores
    elif device.type == "cpu":
        fast = cpu_has_fast_bf16()
    else:
        fast = False
    return Precision.bf16 if fast else Precision.fp32


def cpu_has_fast_bf16() -> bool:
    """AMX or AVX512-bf16 instructions, which oneDNN uses for bf16 convolutions."""
    try:
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    except AttributeError:  # private helpers: absent in other torch versions
        return False


def step_context(precision: Precision, device: torch.device, skip_nonfinite: bool) -> StepContext:
    """Autocast for forward passes, and a GradScaler that is enabled only for fp16."""
    dtype = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}.get(precision)
    autocast = (contextlib.nullcontext if dtype is None
                else functools.partial(torch.autocast, device_type=device.type, dtype=dtype))
    scaler = torch.amp.GradScaler(device.type, enabled=precision == Precision.fp16)
    return StepContext(autocast, scaler, skip_nonfinite)


def compile_models(G: nn.Module, D: Discriminator) -> None:
    """torch.compile each network in place (nn.Module.compile keeps state_dict keys unchanged).

    G and D are compiled apart, not the whole step: a compiled step needs the graph split after
    G's forward, and with Sigmoid + BCELoss inside it once overwrote D's output (RESEARCH.md).
    D's trunk and head are compiled, so both D(x) and D.forward_with_features(x) run compiled.
    """
    G.compile()
    D.features.compile()
    D.head.compile()


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
                     opt_d: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                     batches: BatchStream, fixed_z: Tensor) -> dict[str, Any]:
    """Everything needed to continue as if never stopped, as tensors and plain containers."""
    return {
        "G": G.state_dict(), "D": D.state_dict(),
        "G_ema": G_ema.state_dict() if G_ema is not None else None,
        "opt_g": opt_g.state_dict(), "opt_d": opt_d.state_dict(),
        "scaler": scaler.state_dict(),  # empty unless fp16
        "step": step, "data": batches.state_dict(), "fixed_z": fixed_z,
        "rng": {"python": random.getstate(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "config": to_plain(cfg),
    }


def restore(state: dict[str, Any], G: nn.Module, D: nn.Module, G_ema: Optional[AveragedModel],
            opt_g: torch.optim.Optimizer, opt_d: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
            batches: BatchStream) -> int:
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
    if scaler.is_enabled() and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
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
