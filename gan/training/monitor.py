"""What a person watching the run sees: TensorBoard, a progress bar, log lines, the animation (docs/watching.md)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional

import torch
import yaml
from PIL import Image, ImageDraw, ImageFont
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.hparams.summary_v2 import hparams_pb
from tensorboard.plugins.text.summary_v2 import text_pb
from torch import Tensor
from torch.utils.tensorboard import SummaryWriter
from torchvision.transforms.functional import pil_to_tensor, to_pil_image
from tqdm import tqdm

from gan.config import TrainConfig, to_plain
from gan.core.sampling import image_grid
from gan.data import BatchStream, to_unit_range
from gan.errors import naming
from gan.run import Run
from gan.training.state import TrainingState
from gan.world import World

log = logging.getLogger(__name__)

REAL_TAG, FAKE_TAG, RAW_FAKE_TAG = "samples/real", "samples/fake (EMA G, fixed z)", "samples/fake (G, fixed z)"
BAR_TAGS = {"d": "loss/d", "g": "loss/g", "D(x)": "loss/D(x)", "D(G(z))": "loss/D(G(z))"}  # beside the progress bar
CONFIG_TEXT_TAG, COMMAND_TEXT_TAG, ENVIRONMENT_TEXT_TAG = "run/config", "run/command", "run/environment"
GIF_FRAMES = 50  # at most this many grids in samples/progress.gif, spread evenly over the run
SHORT_CURVE = 10  # quality/FID points under which the Scalars tab's smoothing misleads


def _quiet_event_writer_thread(args: threading.ExceptHookArgs, default=threading.excepthook) -> None:
    # a failed write of TensorBoard's writer thread (a full disk) is raised again by the next write: no traceback
    if not (type(args.thread).__name__ == "_AsyncWriterThread" and issubclass(args.exc_type, OSError)):
        default(args)


threading.excepthook = _quiet_event_writer_thread


def shown_name(key: str) -> str:
    """`d/real` -> `loss/D(x)`, `d/fake_score` -> `train/D(G(z))_score`, `grad_norm/d` -> `train/grad_norm_d`."""
    # D's probabilities under one name whatever the loss, so runs share charts; scores, D_G_z2 (after D's step): train/
    if named := re.fullmatch(r"d/(real|fake)(_.+)?", key):
        judged = "D(x)" if named[1] == "real" else "D(G(z))"
        return f"train/{judged}{named[2]}" if named[2] else f"loss/{judged}"
    group, _, name = key.partition("/")
    if group == "loss" and name not in ("d", "g"):  # a loss's terms (loss/d_r1, loss/g_fm): train/loss_d_r1
        return f"train/loss_{name}"
    return f"train/{group}_{name}" if group in ("grad_norm", "d") else key


class Monitor:
    # Rank 0's alone. The events file opens at the first write, after on_ready(): a failed resume leaves tb/ as is
    def __init__(self, run: Run, step: int, cfg: TrainConfig, world: World, on_ready: Optional[Callable[[], None]]):
        self.run, self.world, self.enabled, self.last = run, world, world.is_main, {}  # last: TrainResult's
        self.tb, self.start_step, self.cfg, self.on_ready = run.tb, step, cfg, on_ready or (lambda: None)
        self.writer, self.events = None, self.tb  # events: the open file; tensorboard's errors name none (or bytes)
        self.pending: list[tuple[summary_pb2.Summary, int]] = []  # written with the first event
        off, steps = not (cfg.trainer.progress and self.enabled), cfg.trainer.max_steps
        self.bar = tqdm(total=steps, initial=step, disable=off, dynamic_ncols=True, desc="train", unit="step")
        # throughput: images since the last log line over the loop's time, less the phases (`timed`)
        self.images_since, self.time_since, self.first_step_done = 0, time.perf_counter(), None

    @contextlib.contextmanager
    def writing(self) -> Iterator[SummaryWriter]:
        if self.writer is None:  # the run's first write
            self.on_ready()
            # after a resume, hide the interrupted run's events past the checkpoint: one curve, not a doubled stretch
            purge_step = self.start_step + 1 if self.start_step else None
            with naming(self.tb):
                self.writer = SummaryWriter(log_dir=str(self.tb), purge_step=purge_step)
            self.events = Path(getattr(self.writer.file_writer.event_writer, "_file_name", self.tb))
        with naming(self.events):
            for summary, step in self.pending:
                self.writer.file_writer.add_summary(summary, step)
            self.pending = []
            yield self.writer

    def begin(self, hparams: Mapping[str, float | str | bool | None], state: TrainingState, labels: Tensor) -> None:
        # a fresh run's; the real images by index (drawing a batch would change the run), in each fake's class
        if state.fixed_y is not None:
            real = class_images(state.batches, labels, state.fixed_y.cpu())
        else:
            count = state.batches.sampler.size
            index = torch.linspace(0, count - 1, min(len(state.fixed_z), count)).long().tolist()
            real = torch.stack([image_at(state.batches, i) for i in index])
        # the trial id, short (its column cuts at 16 characters): `<sweep folder> #<n>`, a start time, or the folder
        run = self.tb.parent
        job, start = re.match(r"(\d+)_", run.name), re.match(r"\d\d-\d\d-\d\d(?=_|$)", run.name)
        trial_id = f"{run.parent.name} #{job.group(1)}" if job else start.group(0) if start else run.name
        typed = {key: "null" if value is None else value for key, value in hparams.items()}  # as the command line
        with self.writing() as writer:
            writer.file_writer.add_summary(hparams_pb(typed, trial_id=trial_id), 0)
            writer.add_image(REAL_TAG, grid_of(to_unit_range(real), state), 0)

    def advance(self, step: int) -> None:
        self.bar.update(1)
        if self.first_step_done is None:  # it may include compiling: logged apart, and left out of the throughput
            self.first_step_done = time.perf_counter()
            if self.enabled:
                log.info("step %d  time/first_step_s=%.4g", step, self.first_step_done - self.time_since)
            self.time_since = self.first_step_done
            return
        self.images_since += self.cfg.data.batch_size * self.world.size  # every batch is whole, on every rank

    @contextlib.contextmanager
    def timed(self, phase: str, step: int) -> Iterator[None]:  # a phase outside the step, left out of time/img_per_s
        if self.enabled:  # the run's record first
            with self.writing():
                pass
        started = time.perf_counter()
        yield
        spent = time.perf_counter() - started
        self.time_since += spent
        if self.enabled:
            with self.writing() as writer:
                writer.add_scalar(f"time/phase_{phase}_s", spent, step)

    def scalars(self, step: int, stats: Mapping[str, Tensor | float]) -> dict[str, float]:
        # diagnostics become Python numbers only here, at log time: float(t) = t.item() waits for the device
        values = {shown_name(tag): float(value) for tag, value in stats.items()}
        now = time.perf_counter()
        if self.images_since:  # none yet when the first log comes right after the first step
            values["time/img_per_s"] = self.images_since / (now - self.time_since)
            values["time/sec_per_kimg"] = 1000 / values["time/img_per_s"]
        self.images_since, self.time_since = 0, now
        shown = {name: f"{values[tag]:.3f}" for name, tag in BAR_TAGS.items() if tag in values}
        self.bar.set_postfix(shown, refresh=False)  # a disabled bar (ranks > 0, trainer.progress=false) shows nothing
        self.last = {}
        self.numbers(step, values)
        return values

    def numbers(self, step: int, values: Mapping[str, float], log_line: bool = True) -> None:
        self.last = {**self.last, **values}
        if not self.enabled or not values:
            return
        with self.writing() as writer:
            for tag, value in values.items():
                writer.add_scalar(tag, value, step)
        if log_line:
            log.info("step %d  %s", step, "  ".join(f"{tag}={value:.4g}" for tag, value in values.items()))

    def describe(self, command: Optional[str], environment: Mapping[str, object]) -> None:  # at the run's start
        step, eval_every, max_steps = self.start_step, self.cfg.trainer.eval_every, self.cfg.trainer.max_steps
        yamls = {CONFIG_TEXT_TAG: to_plain(self.cfg), ENVIRONMENT_TEXT_TAG: dict(environment)}
        texts = {tag: f"```yaml\n{yaml.safe_dump(value, sort_keys=False)}```" for tag, value in yamls.items()}
        if command:  # as inline code: it wraps
            fence = "``" if "`" in command else "`"
            texts[COMMAND_TEXT_TAG] = f"{fence}{command}{fence}"
        if self.enabled:  # the Text tab, written with the run's next event
            self.pending += [(text_pb(tag, text), step) for tag, text in texts.items()]
        # fewer points than SHORT_CURVE are bent out of shape by TensorBoard's default smoothing (docs/watching.md)
        if self.enabled and eval_every and (points := -(-(max_steps - step) // eval_every)) < SHORT_CURVE:
            log.info(
                f"trainer.eval_every={eval_every} draws {points} point(s) of quality/FID in this run, which "
                f"TensorBoard's default smoothing (0.6) bends: read it at Smoothing 0, or set eval_every <= "
                f"{max(1, max_steps // SHORT_CURVE)}."
            )

    def summary(self, summary: summary_pb2.Summary, step: int) -> None:  # text_pb: torch's add_text adds /text_summary
        if self.enabled:
            with self.writing() as writer:
                writer.file_writer.add_summary(summary, step)

    def close(self) -> None:  # `seconds`: the loop's wall time after its first step (TrainResult's)
        self.seconds = time.perf_counter() - self.first_step_done if self.first_step_done else 0.0
        self.bar.close()
        if self.writer is not None:
            with naming(self.events):
                self.writer.close()  # flushes: events are unreadable before flush()/close()


def grid_of(images: Tensor, state: TrainingState) -> Tensor:
    """Images in [-1, 1] as the sample grid: a row per class, its class written at its left, when conditional."""
    if state.fixed_y is None:
        return image_grid(images)
    columns = int((state.fixed_y == state.fixed_y[0]).sum())  # a row per class
    return labelled_rows(image_grid(images, nrow=columns), [str(c) for c in state.fixed_y.cpu().tolist()[::columns]])


def class_images(batches: BatchStream, labels: Tensor, classes: Tensor) -> Tensor:
    """The k-th image of class c for the k-th time c appears; a blank one for a class without images."""
    classes, labels = classes.tolist(), labels.cpu()
    members = {c: (labels == c).nonzero().flatten().tolist() for c in set(classes)}
    picks = [(c, classes[:i].count(c)) for i, c in enumerate(classes)]  # (c, k)
    chosen = [image_at(batches, members[c][k % len(members[c])]) if members[c] else None for c, k in picks]
    blank = torch.zeros_like(next(image for image in chosen if image is not None))
    return torch.stack([image if image is not None else blank for image in chosen])


def image_at(batches: BatchStream, index: int) -> Tensor:  # from memory, or read through the loader's dataset
    item = batches.images[index] if batches.images is not None else batches.loader.dataset[index]
    return torch.as_tensor(item[0] if isinstance(item, tuple) else item).cpu()


def labelled_rows(grid: Tensor, labels: list[str]) -> Tensor:
    row_height, picture = grid.size(1) / len(labels), to_pil_image(grid.mul(255).round().byte())  # L or RGB
    font = ImageFont.load_default()
    margin = round(max(font.getlength(label) for label in labels)) + 6
    framed = Image.new(picture.mode, (picture.width + margin, picture.height), 0)
    framed.paste(picture, (margin, 0))
    draw = ImageDraw.Draw(framed)
    for i, label in enumerate(labels):
        draw.text((3, (i + 0.5) * row_height), label, fill="white", font=font, anchor="lm")  # left, middle
    return pil_to_tensor(framed).float().div(255)


def write_progress_gif(samples_dir: Path, max_frames: int = GIF_FRAMES) -> Path:
    """The DCGAN tutorial's animation, of at most `max_frames` grids spread evenly."""
    frames = sorted(samples_dir.glob("step_*.png"))
    if len(frames) > max_frames:
        frames = [frames[round(i * (len(frames) - 1) / (max_frames - 1))] for i in range(max_frames)]
    images = []
    for path in frames:
        try:
            with Image.open(path) as image:
                images.append(image.convert("RGB"))
        except OSError as err:  # a grid damaged since it was written: the animation goes on without it
            log.warning("Left %s out of progress.gif: it cannot be read as an image (%s).", path, err)
    durations = [200] * (len(images) - 1) + [2000]  # the last held: the final grid is read before the loop restarts
    target, partial = samples_dir / "progress.gif", samples_dir / ".progress.gif.tmp"
    with naming(target):
        images[0].save(partial, format="GIF", save_all=True, append_images=images[1:], duration=durations, loop=0)
        os.replace(partial, target)
    return target
