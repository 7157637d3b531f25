"""The training loop: learning rate, fetch, (1) D step, (2) G step, EMA, overfitting, log, sample, checkpoint.

Read it beside pytorch/examples' dcgan/main.py: the same sections in the same order. What each
section calls lives elsewhere: the steps and the EMA in `gan.core` (the lesson), the objects in
`gan.training.state`, precision and devices in `gan.training.hardware`, the NaN watch, the
finiteness check before a checkpoint and signal handling in `gan.training.faults`, the run
directory's lock in `gan.training.rundir`, TensorBoard in `gan.training.monitor`, the in-training
FID in `gan.training.quality`.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torchvision.utils import save_image

from gan.config import Precision, TrainConfig, to_plain
from gan.core.sampling import image_grid, sample
from gan.core.steps import StepContext, d_step, g_step
from gan.data import BatchStream, ImageSet, load_dataset, to_unit_range
from gan.distributed import SINGLE, World, any_rank, gather_to_main
from gan.training.checkpoint import keep_numbered, load_checkpoint, save_checkpoint
from gan.training.faults import NonFiniteWatch, check_finite_state, explain_allocation_failure, stop_on_signals
from gan.training.hardware import arithmetic_of, prepare_process
from gan.training.monitor import FAKE_TAG, RAW_FAKE_TAG, Monitor, shown_name, trial_name, write_progress_gif
from gan.training.overfit import OverfitProbe, build_probe
from gan.training.rundir import own_run_dir
from gan.training.runs import check_resume
from gan.training.state import (
    TrainingState,
    build_state,
    rng_state,
    set_learning_rates,
    with_objective,
    wrap_for_ddp,
)
from gan.training.threads import thread_governor

if TYPE_CHECKING:
    from gan.training.quality import QualityProbe

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainResult:
    step: int  # generator updates done, in this run and the runs it resumed
    metrics: dict[str, float]  # the last logged scalars
    checkpoint: Path  # checkpoints/last.pt
    stopped_by: Optional[str] = None  # "SIGINT"/"SIGTERM" when a signal ended the run early
    seconds: float = 0.0  # wall time of the loop after its first step (which may include compiling)


def train(
    cfg: TrainConfig,
    run_dir: Path,
    dataset: Optional[ImageSet] = None,
    world: World = SINGLE,
    after_step: Optional[Callable[[TrainingState], bool]] = None,
) -> TrainResult:
    """Train (or resume, if cfg.trainer.resume is set) one run, writing everything into run_dir.

    `dataset` replaces the one cfg.data names (the benchmark feeds its own images this way).
    `world` is this process's place in a torchrun job; rank 0 alone writes files.
    `after_step(state)` is called after every step, EMA included; True ends the run there, with its
    samples and checkpoint, as a signal would (StyleGAN2-ADA's training loop takes an abort_fn the
    same way; scripts/compare.py snapshots G and stops at a wall-clock budget with it).
    """
    trainer, z_dim = cfg.trainer, cfg.model.z_dim
    # rank 0 owns run_dir until it returns: one process at a time, a new run never over an old one's
    # checkpoint, and temporary files of a killed run removed (gan/training/rundir.py)
    with own_run_dir(run_dir, resuming=bool(trainer.resume), enabled=world.is_main):
        # device, the step context (loss, extra terms, precision), the training state, resumed if asked
        device, ctx, state, overfit = set_up(cfg, world, dataset)  # overfit: D's train/held-out gap, or None
        G, D = wrap_for_ddp(state.G, state.D, world, device)  # DDP wrappers: the same modules under DDP
        quality = quality_probe(cfg, device, world)  # FID & co. every trainer.eval_every steps, or None
        monitor = open_monitor(cfg, state, run_dir, world)  # TensorBoard: HParams session, real images
        watch, metrics = NonFiniteWatch(device), {}
        # trainer.threads=0 on the CPU: threads follow the cores other processes leave free, or None
        governor = thread_governor(
            cfg.trainer.threads, device, lambda n: monitor.numbers(state.step, {"time/threads": n})
        )
        with monitor, stop_on_signals() as stop:
            while state.step < trainer.max_steps:
                # learning rate: constant, then linearly to zero over the last optim.lr_decay of the run
                set_learning_rates(state, cfg)

                # fetch: a real batch (with its classes y when model.conditional, else y is None), and
                # latents created on the device (not on the CPU, then moved); fakes drawn for the same y
                real, y = state.batches.next_with_labels()
                z = torch.randn(real.size(0), z_dim, device=device)
                with ctx.autocast():
                    fake = G(z, y)

                # (1) D step, on fake.detach()
                d_stats, real_features = d_step(D, state.opt_d, real, fake, ctx, y)
                # (2) G step, with D frozen. Under DDP the G step uses the unwrapped D: DDP's reducer
                # waits for a gradient of every D parameter after each wrapped forward, and a frozen D
                # makes none. G's own gradients are still averaged by G's wrapper.
                g_stats = g_step(state.D, G, state.opt_g, fake, real_features, ctx, y)
                ctx.scaler.update()  # once per iteration, after both optimizers stepped (fp16 only)
                state.step += 1
                watch.update(state.step, d_stats["loss/d"], g_stats["loss/g"])

                # EMA of G's weights (and BatchNorm statistics), used for every sample
                if state.G_ema is not None:
                    state.G_ema.update_parameters(state.G)
                monitor.advance(state.step, real.size(0) * world.size)  # all ranks' images: time/img_per_s
                if governor is not None:
                    governor.poll()  # reads the clock; /proc once every 2 s
                # Under DDP every rank must stop at the same step: one all-reduce of the stop flag per
                # step (a host sync, the only one besides logging and trainer.on_nan=skip's check).
                asked = after_step is not None and after_step(state)  # the caller's own stop (a time budget)
                done = state.step == trainer.max_steps or any_rank(stop.signal is not None or asked, world, device)

                # overfitting: D's scores on training against held-out reals (gan/training/overfit.py)
                if overfit is not None and state.step % trainer.overfit_every == 0:
                    values = overfit.measure(state.D, ctx)
                    monitor.numbers(state.step, {shown_name(tag): value for tag, value in values.items()})

                # log: scalars leave the device here, at log_every steps (float() waits for the device)
                if state.step % trainer.log_every == 0 or done:
                    watch.check(ctx.skip_nonfinite)
                    metrics = monitor.scalars(state.step, {**d_stats, **g_stats})

                # sample: the fixed latents through the EMA generator, in eval mode
                if world.is_main and (state.step % trainer.sample_every == 0 or done):
                    write_samples(state, run_dir, monitor)
                # quality: FID, precision/recall and classes of the EMA generator's samples
                if quality is not None and (state.step % trainer.eval_every == 0 or done):
                    measure_quality(quality, state, monitor)

                # checkpoint: never over the last good one with weights a NaN has reached
                if state.step % trainer.checkpoint_every == 0 or done:
                    rngs = gather_to_main(rng_state(device), world)  # every rank's generators, for resume
                    if world.is_main:
                        watch.check(ctx.skip_nonfinite)
                        check_finite_state(state, last_checkpoint(run_dir))  # weights and Adam moments, too
                        with monitor.timed("checkpoint", state.step):
                            write_checkpoint(state, cfg, run_dir, rngs)
                if done:  # a signal that lands after `done` was computed gets one more step
                    break
            monitor.end_session(state.step, finished=state.step == trainer.max_steps)
        return TrainResult(state.step, metrics, last_checkpoint(run_dir), stop.signal, monitor.seconds)


def set_up(
    cfg: TrainConfig, world: World, dataset: Optional[ImageSet]
) -> tuple[torch.device, StepContext, TrainingState, Optional[OverfitProbe]]:
    """This process's device, the StepContext of both steps, the training state (resumed when
    cfg.trainer.resume names a checkpoint), and the overfitting probe (None when off, or when the
    caller feeds its own `dataset`, which has no held-out split)."""
    device = prepare_process(cfg, world)
    # read the checkpoint to resume from before any work, so a bad path fails at once
    resume_from = load_checkpoint(cfg.trainer.resume, map_location=device) if cfg.trainer.resume else None
    arithmetic, precision = arithmetic_of(cfg, device)
    ctx = with_objective(arithmetic, cfg)  # the loss, its extra terms, and the precision of both steps
    probe = None
    with explain_allocation_failure(cfg):  # model.g_width=10000000: one paragraph, not a traceback
        training_set = dataset or load_dataset(cfg.data)
        state = build_state(cfg, device, ctx.scaler, world, training_set)
        if dataset is None:
            probe = build_probe(cfg, training_set, device)
    if resume_from is not None:
        check_resume(cfg, resume_from)  # the resume contract: gan/training/runs.py
        state.load_state_dict(resume_from, world)
        log.info("Resumed from %s at step %d", cfg.trainer.resume, state.step)
    announce(cfg, device, precision, world)
    return device, ctx, state, probe


def announce(cfg: TrainConfig, device: torch.device, precision: Precision, world: World) -> None:
    auto = " (trainer.precision=auto)" if cfg.trainer.precision == Precision.auto else ""
    log.info("Training on %s in %s%s, %d process(es)", device, precision.value, auto, world.size)


def last_checkpoint(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "last.pt"


def open_monitor(cfg: TrainConfig, state: TrainingState, run_dir: Path, world: World) -> Monitor:
    """The run's Monitor (rank 0 writes), its HParams session open and, for a fresh run, a grid of
    real images beside the first fake one; it logs both optimizers' learning rates."""
    trainer = cfg.trainer
    monitor = Monitor(run_dir, state.step, trainer.max_steps, trainer.progress, enabled=world.is_main)
    fresh = world.is_main and state.step == 0
    real = image_grid(to_unit_range(real_images(state.batches, trainer.num_fixed_samples))) if fresh else None
    monitor.begin(hparams_of(cfg), trial_name(run_dir), {"g": state.opt_g, "d": state.opt_d}, real, state.step)
    return monitor


def real_images(batches: BatchStream, count: int) -> torch.Tensor:
    """`count` training images spread evenly over the split (a folder sorted by class shows each
    class), uint8 on the CPU, read by index: drawing a batch from the stream would change the run."""
    source = batches.images if batches.images is not None else batches.loader.dataset
    index = torch.linspace(0, len(source) - 1, min(count, len(source))).long().tolist()
    return torch.stack([torch.as_tensor(source[i]).cpu() for i in index])


def quality_probe(cfg: TrainConfig, device: torch.device, world: World) -> Optional[QualityProbe]:
    """The in-training quality measurement when trainer.eval_every asks for one; rank 0 measures."""
    if not (cfg.trainer.eval_every and world.is_main):
        return None
    # imported here: gan.evaluation imports gan.training (checkpoints), so a module-level import
    # would be circular when evaluate.py is the entry point
    from gan.training.quality import QualityProbe

    return QualityProbe(cfg.data, cfg.trainer.eval_samples, cfg.trainer.seed, device)


def measure_quality(probe: QualityProbe, state: TrainingState, monitor: Monitor) -> None:
    """Score the EMA generator (the one every grid shows) and write the numbers as quality/*."""
    with monitor.timed("quality", state.step):
        values = probe.measure(state.sampler)
    monitor.numbers(state.step, values)


def write_samples(state: TrainingState, run_dir: Path, monitor: Monitor) -> None:
    """The fixed-latent grid of this step (a row per class in a conditional run), as
    samples/step_NNNNNN.png, in samples/progress.gif and in TensorBoard."""
    with monitor.timed("sample", state.step):
        grid = image_grid(sample(state.sampler, state.fixed_z, state.fixed_y), nrow=state.grid_columns)
        samples_dir = run_dir / "samples"
        samples_dir.mkdir(parents=True, exist_ok=True)
        save_image(grid, samples_dir / f"step_{state.step:06d}.png")
        write_progress_gif(samples_dir)
        monitor.image(FAKE_TAG if state.G_ema is not None else RAW_FAKE_TAG, grid, state.step)


def write_checkpoint(
    state: TrainingState, cfg: TrainConfig, run_dir: Path, rank_rngs: Optional[list[dict]] = None
) -> None:
    """checkpoints/last.pt, atomically, and a numbered copy if trainer.keep_checkpoints asks."""
    path = last_checkpoint(run_dir)
    save_checkpoint(state.state_dict(cfg, rank_rngs), path)
    keep_numbered(path, state.step, cfg.trainer.keep_checkpoints)


def hparams_of(cfg: TrainConfig) -> dict[str, int | float | str | bool | None]:
    """The config flattened to 'group.key' -> value, typed (bool, number, string, None): the
    columns of TensorBoard's HParams page. trainer.resume and trainer.progress are left out: how a
    run was started and shown, not what it computes."""
    flat = {}
    for group, values in to_plain(cfg).items():
        for key, value in values.items():
            typed = value is None or isinstance(value, (int, float, str, bool))
            flat[f"{group}.{key}"] = value if typed else str(value)
    for key in ("trainer.resume", "trainer.progress"):
        flat.pop(key, None)
    return flat
