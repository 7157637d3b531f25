"""The training loop; read it beside pytorch/examples' dcgan/main.py, whose `if i % 100 == 0` blocks are `extras`."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import math
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterable, Mapping, NamedTuple, Optional, Sequence

import torch
from tensorboard.plugins.text.summary_v2 import text_pb
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams as hparams_summaries
from torchvision.utils import save_image

from gan.checkpoint import BEST, checkpoint_path, keep_numbered, load_checkpoint, save_checkpoint
from gan.config import EvaluateConfig, LossName, OnDWon, TrainConfig, to_plain
from gan.core.sampling import sample
from gan.core.steps import StepContext, d_step, g_step
from gan.data import EmptySplitError, ImageSet, open_source, take, to_unit_range
from gan.device import environment
from gan.distributed import any_rank, gather_to_main, mean_over_ranks
from gan.errors import ConfigError, DataError, MetricsError, UserError, naming
from gan.evaluation import metrics as M
from gan.evaluation.pipeline import Reals, class_metrics, classifier_data, evaluate, generate, reference_subset
from gan.launch import measure_command, override_key, resume_command
from gan.run import Run
from gan.training.faults import NonFiniteWatch, check_finite_state, stop_on_signals
from gan.training.monitor import FAKE_TAG, RAW_FAKE_TAG, Monitor, grid_of, shown_name, write_progress_gif
from gan.training.state import TrainingState, rng_state, set_learning_rates, set_up
from gan.training.threads import thread_governor
from gan.world import SINGLE, World

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainResult:
    step: int  # generator updates done, in this run and the runs it resumed
    metrics: dict[str, float]  # the last logged scalars
    checkpoint: Path  # checkpoints/last.pt
    stopped_by: Optional[str] = None  # "SIGINT"/"SIGTERM" when a signal ended the run early, "d_won" the alarm
    seconds: float = 0.0  # wall time of the loop after its first step (which may include compiling)
    best: Optional[dict[str, float]] = None  # {"fid", "step"} of checkpoints/best.pt (trainer.eval_every), or None

    def outcome(self) -> str:
        fid = self.metrics.get(FID_TAG)
        last = f"Last: {self.checkpoint} (step {self.step}" + ("" if fid is None else f", in-training FID {fid:.4g}")
        if self.best is None:
            return last + ")."
        best = Run.of_checkpoint(self.checkpoint).best
        return f"{last}); best: {best} (step {self.best['step']}, in-training FID {self.best['fid']:.4g})."


def train(
    cfg: TrainConfig,
    run_dir: Path,
    dataset: Optional[ImageSet] = None,
    world: World = SINGLE,
    after_step: Optional[Callable[[TrainingState], bool]] = None,
    on_ready: Optional[Callable[[], None]] = None,
    command: Optional[str] = None,
    hparams: Optional[Mapping[str, float | str | bool | None]] = None,
) -> TrainResult:
    """Train (or resume) into run_dir; after_step(state) -> True stops as a signal would; on_ready() before writing."""
    cfg.check()  # here for every caller: train.py, gan.api, a config built in code
    trainer, z_dim, run = cfg.trainer, cfg.model.z_dim, Run(run_dir)
    resuming = checkpoint_path(trainer.resume) if trainer.resume else None
    with run.owned_for_training(resuming) if world.is_main else contextlib.nullcontext():  # rank 0's alone
        device, ctx, state, training = set_up(cfg, world, dataset)  # may refuse: nothing is written yet
        probes = build_probes(cfg, training, device, world, own_data=dataset is None)  # each may refuse
        if world.is_main:
            run.check_outputs()  # every place the run writes takes a file: nothing fails half-way for that
        G, D = state.G, state.D  # under DDP: wrappers sharing their parameters; checkpoints and samples use these
        if world.distributed:
            ids = [device.index] if device.type == "cuda" else None
            G, D = DistributedDataParallel(G, device_ids=ids), DistributedDataParallel(D, device_ids=ids)
        monitor = Monitor(run, state.step, cfg, world, on_ready)
        if world.is_main and state.step == 0:  # HParams and the real images, once per run
            monitor.begin(hparams_of(cfg) if hparams is None else hparams, state, training.labels)
        monitor.describe(command, environment(device))
        with contextlib.closing(monitor), stop_on_signals() as stop:
            extras = periodic_extras(cfg, state, ctx, monitor, stop, probes)
            while state.step < trainer.max_steps:
                # fetch: a real batch (with its classes y when model.conditional, else y is None), and
                # latents created on the device (not on the CPU, then moved); fakes drawn for the same y
                real, y = state.batches.next_with_labels()
                z = torch.randn(real.size(0), z_dim, device=device)
                with ctx.autocast():
                    fake = G(z, y)

                # (1) D step, on fake.detach()
                d_stats, real_features = d_step(D, state.opt_d, real, fake, ctx, y)
                # (2) G step, D frozen and unwrapped: DDP's reducer would wait for gradients a frozen D never makes
                g_stats = g_step(state.D, G, state.opt_g, fake, real_features, ctx, y)
                ctx.scaler.update()  # once per iteration, after both optimizers stepped (fp16 only)
                state.step += 1

                # EMA of G's weights (and BatchNorm statistics), used for every sample; every model.ema_every steps
                if state.G_ema is not None and state.step % cfg.model.ema_every == 0:
                    state.G_ema.update_parameters(state.G)

                # stop: at max_steps, a signal, the D-won alarm or the caller; under DDP all ranks at once (a host sync)
                asked = after_step is not None and after_step(state)
                done = state.step == trainer.max_steps or any_rank(stop.reason is not None or asked, world, device)

                # every N steps: log, sample, measure, checkpoint, ... (the list in periodic_extras)
                extras.after_step(Tick(state.step, {**d_stats, **g_stats}), done)
                if done:  # a signal that lands after `done` was computed gets one more step
                    break
            if state.best:  # the run's result, one point each, in the group TensorBoard opens first
                monitor.numbers(state.step, {BEST_FID_TAG: state.best["fid"]})
            # HParams' STATUS_SUCCESS; the first status stays, and a stop may resume
            if state.step == trainer.max_steps:
                monitor.summary(hparams_summaries({}, {})[2], state.step)  # torch's session-end summary
        return TrainResult(state.step, monitor.last, run.last, stop.reason, monitor.seconds, state.best)


class Tick(NamedTuple):  # an iteration, as the periodic extras see it (StyleGAN2-ADA's tick)
    step: int  # generator updates done, this iteration's included
    stats: Mapping[str, Tensor]  # both steps' diagnostics, 0-dim tensors still on the device


@dataclasses.dataclass(frozen=True)
class Every:  # run(tick) after every `steps`-th iteration (0: never), and after the last when `at_end`
    name: str
    steps: int
    run: Callable[[Tick], None]
    at_end: bool = False


class Extras:
    def __init__(self, tasks: Iterable[Every]):
        self.tasks = [task for task in tasks if task.steps > 0]

    def after_step(self, tick: Tick, done: bool) -> None:  # done: the run ends with this iteration
        for task in self.tasks:
            if tick.step % task.steps == 0 or (task.at_end and done):
                task.run(tick)


def periodic_extras(
    cfg: TrainConfig, state: TrainingState, ctx: StepContext, monitor: Monitor, stop: SimpleNamespace, probes: tuple
) -> Extras:  # `stop`: stop_on_signals' flag; `probes`: build_probes'
    trainer, (overfit, quality), device = cfg.trainer, probes, state.fixed_z.device
    run, world, main = monitor.run, monitor.world, monitor.enabled  # main: rank 0
    mean = functools.partial(mean_over_ranks, world=world)  # ADA's r_t, over all ranks
    watch = NonFiniteWatch(device, run.last, cfg)  # NaN losses, read at log/checkpoint only
    governor = thread_governor(trainer.adapt_threads, device)  # None: a fixed count

    def raise_alarm(step: int, message: str) -> None:  # D has won (DWonWatch): warn, and stop if asked
        stopping = trainer.on_d_won == OnDWon.stop
        message += " Stopping here (trainer.on_d_won=stop)." if stopping else " trainer.on_d_won=stop ends it here."
        log.warning("%s", message)
        monitor.summary(text_pb(D_WON_TEXT_TAG, message), step)
        stop.reason = stop.reason or ("d_won" if stopping else None)  # a signal's name first

    watching = trainer.on_d_won != OnDWon.off and cfg.loss.name != LossName.wgan_gp  # a critic's scores: no probability
    alarm = DWonWatch(trainer.d_won_window, trainer.log_every, raise_alarm) if watching else None

    def log_scalars(tick: Tick) -> None:  # scalars leave the device here (float() waits for it)
        watch.check(ctx.skip_nonfinite)
        extra = {"train/lr_g": state.opt_g.param_groups[0]["lr"], "train/lr_d": state.opt_d.param_groups[0]["lr"]}
        if state.augment is not None:
            extra["train/augment_p"] = state.augment.p
        if governor is not None:
            extra["time/threads"] = governor.threads
        values = monitor.scalars(tick.step, {**tick.stats, **extra})
        if alarm is not None:
            monitor.numbers(tick.step, alarm.observe(tick.step, values), log_line=False)

    def measure_overfit(tick: Tick) -> None:
        monitor.numbers(tick.step, {shown_name(tag): value for tag, value in overfit.measure(state.D, ctx).items()})

    def measure_quality(tick: Tick) -> None:  # best.pt: G and G_ema at the best FID, for evaluate.py; no resume
        with monitor.timed("quality", tick.step):
            values = quality.measure(state.sampler)
        if values[FID_TAG] < (state.best["fid"] if state.best else math.inf):  # NaN never is
            state.best = {"fid": values[FID_TAG], "step": tick.step}
            full = state.state_dict(cfg)
            kept = {key: full[key] for key in ("G", "G_ema", "num_classes", "step", "config", "environment")}
            with monitor.timed("checkpoint", tick.step):
                save_checkpoint({"kind": BEST, **kept, "metrics": dict(values)}, run.best)
        monitor.numbers(tick.step, values)

    def write_samples(tick: Tick) -> None:  # the fixed latents' grid: samples/step_NNNNNN.png, progress.gif, tb/
        with monitor.timed("sample", tick.step):
            grid = grid_of(sample(state.sampler, state.fixed_z, state.fixed_y), state)
            run.samples.mkdir(parents=True, exist_ok=True)
            path = run.samples / f"step_{tick.step:06d}.png"
            partial = path.with_name(f".{path.name}.tmp")  # replaced whole: an old damaged image is never half-kept
            with naming(path):
                save_image(grid, partial, format="png")
                os.replace(partial, path)
            write_progress_gif(run.samples)
            with monitor.writing() as writer:  # NaN pixels (a diverged G) drawn black: numpy's uint8 cast is arbitrary
                writer.add_image(FAKE_TAG if state.G_ema else RAW_FAKE_TAG, grid.nan_to_num(0.0), tick.step)

    def checkpoint(tick: Tick) -> None:  # never over the last good one with weights a NaN has reached
        rngs = gather_to_main(rng_state(device, state.augment), world)  # every rank's generators, for resume
        if main:
            watch.check(ctx.skip_nonfinite)
            check_finite_state(state, run.last)
            with monitor.timed("checkpoint", tick.step):
                save_checkpoint(state.state_dict(cfg, rngs), run.last)
                keep_numbered(run.last, state.step, trainer.keep_checkpoints)

    tasks = [
        Every("NaN watch", 1, lambda tick: watch.update(tick.step, tick.stats["loss/d"], tick.stats["loss/g"])),
        Every("progress", 1, lambda tick: monitor.advance(tick.step)),
        Every("threads", 1 if governor else 0, lambda tick: governor.poll()),
        Every("overfitting", trainer.overfit_every if overfit else 0, measure_overfit),
        Every("augment p", 1 if state.augment else 0, lambda t: state.augment.observe(t.stats["d/overfit_rt"], mean)),
        Every("log", trainer.log_every, log_scalars, at_end=True),
        Every("sample", trainer.sample_every if main else 0, write_samples, at_end=True),
        Every("quality", trainer.eval_every if quality else 0, measure_quality, at_end=True),
        Every("checkpoint", trainer.checkpoint_every, checkpoint, at_end=True),
        Every("learning rate", 1, lambda tick: set_learning_rates(state, cfg)),  # the next step's
    ]
    return Extras(tasks)


FAKE_BELOW, RT_ABOVE = 0.05, 0.9  # D(G(z)) below sigmoid(-2.9) while r_t says nearly every real logit is positive
D_OF_FAKE_TAG, RT_TAG = "loss/D(G(z))", "train/d_overfit_rt"
WON_TAG, ALARM_TAG, D_WON_TEXT_TAG = "train/d_won", "alarm/D_won", "run/d_won"  # docs/watching.md


class DWonWatch:
    """Has D won over a window of trainer.d_won_window steps? `on_alarm` is called once per episode."""

    def __init__(self, window_steps: int, log_every: int, on_alarm: Callable[[int, str], None]):
        self.window_steps, self.on_alarm, self.won = window_steps, on_alarm, False
        self.recent = collections.deque(maxlen=max(1, window_steps // log_every))  # (D(G(z)), r_t) per log point

    def observe(self, step: int, values: Mapping[str, float]) -> dict[str, float]:
        fake, rt = values.get(D_OF_FAKE_TAG), values.get(RT_TAG)
        if fake is None or rt is None or not (math.isfinite(fake) and math.isfinite(rt)):
            return {}
        self.recent.append((fake, rt))
        mean_fake, mean_rt = (sum(column) / len(self.recent) for column in zip(*self.recent))
        won = len(self.recent) == self.recent.maxlen and mean_fake < FAKE_BELOW and mean_rt > RT_ABOVE
        fired, self.won = won and not self.won, won
        if fired:
            self.on_alarm(
                step,
                f"D has won at step {step}: over the last {self.window_steps} steps mean D(G(z)) {mean_fake:.3f} "
                f"(< {FAKE_BELOW}), r_t {mean_rt:.2f} (> {RT_ABOVE}); G's samples may decay from here "
                "(trainer.eval_every keeps the best in checkpoints/best.pt; docs/results.md, 'Training longer').",
            )
        return {WON_TAG: float(won), **({ALARM_TAG: 1.0} if fired else {})}


def final_evaluation(cfg: TrainConfig, result: TrainResult, run_dir: Path) -> float:
    """evaluate.py's metrics of the finished run into RUN_DIR/eval and its TensorBoard events; returns the FID."""
    trainer, run = cfg.trainer, Run(run_dir)
    samples, device, threads = trainer.final_eval_samples, trainer.device, trainer.threads
    eval_cfg = EvaluateConfig(checkpoint=str(result.checkpoint), num_samples=samples, device=device, threads=threads)
    eval_cfg.check()
    try:
        results = evaluate(eval_cfg, run.eval, tb_dir=run.tb)  # one TensorBoard run per job
    except MetricsError as err:  # its advice names evaluate.py's metrics.*, which train.py does not take
        raise MetricsError(f"{err} {measure_later(run_dir)}") from err
    with SummaryWriter(log_dir=str(run.tb)) as writer:  # the run's own events: its colour, its HParams session
        writer.add_scalar(FINAL_FID_TAG, float(results["fid"]), result.step)
    return float(results["fid"])


def measure_later(run_dir: Path) -> str:
    return (
        f"The run trained and its checkpoint is saved in {run_dir}: measure it with {measure_command(run_dir)} "
        "(which takes metrics.*), or set trainer.final_eval_samples=0 to train without the final evaluation."
    )


def what_is_kept(run_dir: Path) -> str:  # what to run after a failed write
    last = Run(run_dir).last
    try:
        step = load_checkpoint(last)["step"]
    except UserError:
        return (
            f"run the command again. No checkpoint of this run was written ({last} does not exist), so the run "
            f"starts again from step 0: delete {run_dir} first if it holds this attempt's record (.hydra/)."
        )
    return f"resume: {resume_command(run_dir)} ({last} holds step {step}; checkpoints are written whole or not at all)."


def peer_lost(err: RuntimeError) -> Optional[str]:
    """The first sentence of gloo's or NCCL's report of a process that died mid-collective; else None."""
    text = str(err)
    if isinstance(err, torch.distributed.DistError) or any(word in text for word in ("gloo", "NCCL", "by peer")):
        return re.sub(r"^\[[^\]]*\] ", "", text.strip().splitlines()[0]).split(". ")[0]


PROBE_IMAGES = 512  # enough for a mean score to move by less than the gap it shows


def build_probes(
    cfg: TrainConfig, train: ImageSet, device: torch.device, world: World, own_data: bool = True
) -> tuple[Optional[OverfitProbe], Optional[QualityProbe]]:
    """D's overfitting probe and rank 0's quality probe, each refused before training; `own_data`: a held-out split."""
    trainer, model, held_out, overfit = cfg.trainer, cfg.model, None, None
    final = f"trainer.final_eval_samples={trainer.final_eval_samples}"
    if own_data and (trainer.overfit_every or trainer.final_eval_samples):  # the held-out split is first opened here
        try:
            held_out = open_source(cfg.data, train=False)
        except DataError as err:
            if trainer.final_eval_samples:
                raise DataError(f"{err} {final} measures the trained generator on it: fix it, or set it to 0.") from err
            if isinstance(err, EmptySplitError):  # a small folder: nothing is wrong with the data
                log.info("No held-out images to compare D's scores with (%s): d/heldout_gap is not logged.", err)
            else:  # damaged or missing files: the run goes on, but the user must hear it before evaluate.py fails
                log.warning(f"The held-out split cannot be read: {err} No d/heldout_gap; evaluate.py will refuse it.")
    count = min(PROBE_IMAGES, len(train.images), len(held_out)) if held_out is not None and trainer.overfit_every else 0
    count -= count % model.pack  # D judges packs of model.pack images
    if count >= model.pack:
        pick, subsets = torch.Generator().manual_seed(20_200_611), []  # its own: the run's streams are untouched
        for images, labels in ((train.images, train.labels), (held_out, held_out.labels)):
            index = torch.randperm(len(images), generator=pick)[:count]
            subsets.append((take(images, index).to(device), labels[index].to(device) if model.conditional else None))
        overfit = OverfitProbe(*subsets, min(cfg.data.batch_size, count))
    if trainer.final_eval_samples and world.is_main:
        # final_evaluation's classifier, trained (and cached) now: one evaluate.py would refuse stops the run first
        try:
            labelled = classifier_data(cfg.data, M.is_stacked(train))
            M.load_or_train_classifier(labelled, EvaluateConfig().metrics.classifier, device)
        except MetricsError as err:
            raise MetricsError(f"{final}: {err} Nothing was trained; or set trainer.final_eval_samples=0.") from err
    return overfit, QualityProbe(cfg, train, device) if trainer.eval_every and world.is_main else None


class OverfitProbe:
    # Is D memorising? Its scores on training and held-out reals part before FID worsens (Karras et al. 2020, fig. 1)
    def __init__(self, train: tuple[Tensor, Optional[Tensor]], held_out: tuple[Tensor, Optional[Tensor]], batch_size):
        self.train, self.held_out, self.batch_size = train, held_out, batch_size

    @torch.no_grad()
    def measure(self, D: nn.Module, ctx: StepContext) -> dict[str, float]:
        saved, means = [buffer.clone() for buffer in D.buffers()], []
        try:
            for images, labels in (self.train, self.held_out):
                ys = [None] * len(images) if labels is None else labels.split(self.batch_size)
                with ctx.autocast():
                    scores = [D(to_unit_range(x), y).float() for x, y in zip(images.split(self.batch_size), ys)]
                means.append(float(torch.cat(scores).mean()))
        finally:  # training untouched: D's buffers put back, and no random number was drawn
            for buffer, value in zip(D.buffers(), saved):
                buffer.copy_(value)
        return {"d/score_train": means[0], "d/score_heldout": means[1], "d/heldout_gap": means[0] - means[1]}


_NAMES = ("precision", "recall", "density", "coverage", "classes_covered", "class_kl", "modes_covered", "mode_kl")
QUALITY_TAGS = {"fid": "quality/FID", **{name: f"quality/{name}" for name in _NAMES}}  # FID first: capitals sort first
FID_TAG = QUALITY_TAGS["fid"]
# one point each at the run's end; `FID` sorts before `loss`, so TensorBoard opens it first (docs/watching.md)
BEST_FID_TAG, FINAL_FID_TAG = "FID/best", "FID/final"  # best.pt's quality/FID; evaluate.py's of the last checkpoint


class QualityProbe:
    """The EMA G's quality every trainer.eval_every steps from the same seeded latents (docs/watching.md)."""

    def __init__(self, cfg: TrainConfig, training: ImageSet, device: torch.device):
        started, data, samples, seed = time.perf_counter(), cfg.data, cfg.trainer.eval_samples, cfg.trainer.seed
        if training.num_classes < 2:
            raise ConfigError(
                f"trainer.eval_every needs labelled data (its FID is in a classifier's features): data={data.name} has "
                f"{training.num_classes} class. Set trainer.eval_every=0; evaluate.py metrics.features=inception."
            )
        # the training split: a pick of best.pt on the test split would flatter it; fork_rng: the run's stream untouched
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            images, labels = reference_subset(training, samples, seed, "training split", "trainer.eval_samples")
            images, labels = images.cpu(), labels.cpu()  # the split may live on the training device
            self.reals = Reals(images, labels, stacked=M.is_stacked(training))
            self.config = EvaluateConfig(checkpoint="(training)", num_samples=samples, seed=seed, batch_size=500)
            accept_any = dataclasses.replace(self.config.metrics.classifier, min_accuracy=0.0)  # warned below
            labelled = classifier_data(data, self.reals.stacked)
            self.classifier, accuracy, path = M.load_or_train_classifier(labelled, accept_any, device)
        if accuracy < (bar := self.config.metrics.classifier.min_accuracy):
            log.warning(
                f"The metrics classifier of data={data.name} reaches {100 * accuracy:.2f}% test accuracy, "
                f"below evaluate.py's bar of {100 * bar:.0f}%: the in-training FID uses it all the same."
            )
        self.features = M.ClassifierFeatures(self.classifier, self.reals.stacked, images.size(1)).to(device)
        self.device, self.real_features = device, M.batched(self.features, images, self.config.batch_size, device)
        log.info(
            f"In-training quality: {samples} samples against {images.size(0)} training images, features of "
            f"{path.name} ({100 * accuracy:.2f}% accuracy); set up in {time.perf_counter() - started:.1f} s"
        )

    def measure(self, G: nn.Module) -> dict[str, float]:
        cfg = self.config
        labels = M.sample_classes(self.reals.labels, cfg.num_samples, None, cfg.seed) if G.num_classes else None
        fake: Tensor = generate(G, cfg.num_samples, cfg.batch_size, cfg.seed, self.device, labels)
        real, fake_features = self.real_features, M.batched(self.features, fake, cfg.batch_size, self.device)
        results = {"fid": M.fid(real, fake_features)}
        results.update(M.precision_recall_density_coverage(real, fake_features, cfg.metrics.pr_k, cfg.metrics.dc_k))
        results.update(class_metrics(self.classifier, self.reals, fake, cfg, self.device))
        return {QUALITY_TAGS[key]: float(value) for key, value in results.items() if key in QUALITY_TAGS}


# Every run reports these to HParams, defaults too; four leave FID/best on a 1400 px screen (docs/watching.md)
COMPARED = ("data", "loss", "optim.lr", "trainer.max_steps")


def hparams_of(cfg: TrainConfig, swept: Sequence[str] = ()) -> dict[str, float | str | bool | None]:
    """The HParams columns: COMPARED, then the keys of a sweep job's `swept` overrides the four do not show."""
    plain = to_plain(cfg)
    data = plain["data"]["name"] + (", conditional" if plain["model"]["conditional"] else "")
    columns = dict(zip(COMPARED, (data, plain["loss"]["name"], plain["optim"]["lr"], plain["trainer"]["max_steps"])))
    for override in swept:  # a deletion (~key) sets nothing to compare; the four show theirs (`data`: conditional too)
        key = override_key(override).removesuffix(".name")  # data.name=x and data=x: the column `data`
        group, _, field = key.partition(".")
        if not override.startswith("~") and key not in (*columns, "model.conditional"):
            # a config group's choice (experiment=wgan_gp), or a key of no group, as the command gave it
            columns[key] = plain[group][field] if field in plain.get(group, {}) else override.split("=", 1)[1]
    # ints (and lists) as text: the page prints every number to five digits, 300 as 300.00
    return {key: v if v is None or isinstance(v, (float, str, bool)) else str(v) for key, v in columns.items()}
