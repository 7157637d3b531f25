"""Time to quality: this project's default against the canonical DCGAN, on one wall-clock budget.

    python scripts/compare.py                                  # digits, 32 px, 600 s a side (about 25 min)
    python scripts/compare.py --budget-s 300 --samples 5000    # a quicker look
    python scripts/compare.py data=fashion_mnist data.root=/path/to/datasets \
        metrics.classifier.epochs=5 metrics.classifier.min_accuracy=0.9

Trains, on the same training split and for the same wall-clock budget, (a) the canonical DCGAN of
pytorch/examples' dcgan/main.py as scripts/canonical_dcgan.py rewrites it (fp32, Sigmoid + BCELoss,
Adam(2e-4, 0.5), zero_grad(), N(0, 0.02) init, batch 64, a 2-worker DataLoader, no EMA, samples
from the raw G in training mode) and (b) `python train.py` with its defaults and the overrides given
here (data=..., model.*, ...), samples from the EMA generator. The canonical loop has no end of its
own and trains until the budget; the project's run ends at its trainer.max_steps or at the budget,
whichever comes first, as a user's `python train.py` would (optim.lr_decay, when set, plans its
learning rate toward that end), and a run that ends before the budget is measured at its end: its
final generator is what it has at the budget. Each side runs in a fresh process, one after the
other: run together they would share the cores and each would measure the other's
load; interleaving them (stopping one process while the other runs) would also split caches and
the allocator's warm memory between them. What sequential runs cannot rule out, load from outside
drifting between the two, is measured instead: the CPU time other processes used during each side
(psutil's per-CPU times), printed with the table, so a run on a busy machine shows itself.

The clock of each side starts after its first iteration (which builds kernels and starts the
DataLoader's workers) and counts everything the trainer does after it, its own sample grids and
checkpoints included; it stops while a snapshot of G is written. Snapshots fall on a geometric grid
of training seconds (each sqrt(2) x the last, ending at the budget, plus 60 s), so a log-time plot
has even points. After both sides have trained, every snapshot is measured with evaluate.py's
metrics and feature space (`metrics.*` overrides as evaluate.py takes them) on --samples samples
against as many held-out images: the project's EMA generator with its BatchNorm statistics
recomputed as evaluate.py does, the canonical netG as main.py draws its pictures (training-mode
BatchNorm over batches of 64; its last snapshot is also shown in eval mode).

Prints a table, writes OUT/fid_vs_time.png, OUT/compare.json and each side's run under OUT, and ends
with one line:
    time_to_quality=X fid_at_budget_ratio=Y fid_project=.. fid_canonical=.. recall_project=.. recall_canonical=..
time_to_quality = the canonical's seconds to its best FID within the budget / the project's seconds
to its first snapshot at or below that FID (a lower bound: the project got there somewhere
between that snapshot and the one before; 0 if it never did); fid_at_budget_ratio = the
canonical's FID at the budget / the project's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repo's gan and scripts

from gan.api import compose_config  # noqa: E402
from gan.config import EvaluateConfig, MetricsConfig, TrainConfig, to_plain  # noqa: E402
from gan.data import load_dataset  # noqa: E402
from gan.device import resolve_device  # noqa: E402
from gan.errors import ConfigError, UserError  # noqa: E402
from gan.evaluation import metrics as M  # noqa: E402
from gan.evaluation.pipeline import Reals, classifier_for, generate, measure, prepare_generator, reference_subset  # noqa: E402
from gan.training import train  # noqa: E402
from gan.training.state import TrainingState  # noqa: E402
from gan.training.threads import machine_busy_seconds  # noqa: E402
from scripts import canonical_dcgan as canonical  # noqa: E402

log = logging.getLogger("compare")
SIDES = ("canonical", "project")


# the training clock ------------------------------------------------------------------------------


def snapshot_times(budget: float, extra: tuple[float, ...] = (60.0,)) -> list[float]:
    """Training seconds at which G is snapshotted: budget / sqrt(2)^k down to about 10 s (at least
    three points), plus `extra` below the budget."""
    count = max(3, int(math.log(max(budget, 1e-9) / 10) / math.log(math.sqrt(2))) + 1)
    times = {budget / math.sqrt(2) ** k for k in range(count)} | {t for t in extra if t < budget}
    return sorted(times)


class Budget:
    """The clock of one side. `tick(step, snapshot, last)` after every iteration: the first tick starts
    the clock; at each snapshot time `snapshot()` is written to FOLDER/NN.pt with the seconds and step
    (the clock stops while it is written); True once the last snapshot, at the budget, is written.
    `last`: the run ends with this iteration, before the budget; it is snapshotted where it is."""

    def __init__(self, times: list[float], folder: Path):
        self.times, self.folder = list(times), folder
        self.start: Optional[float] = None
        self.paused, self.written = 0.0, 0
        folder.mkdir(parents=True, exist_ok=True)

    def tick(self, step: int, snapshot: Callable[[], dict[str, Any]], last: bool = False) -> bool:
        now = time.perf_counter()
        if self.start is None and not last:
            self.start = now
            return False
        elapsed = now - (now if self.start is None else self.start) - self.paused
        if last:  # the run ends here, before the budget: a snapshot where it is, none after
            self.times = [t for t in self.times if t <= elapsed] or [elapsed]
        while self.times and self.times[0] <= elapsed:
            self.times.pop(0)
            torch.save({**snapshot(), "seconds": elapsed, "step": step}, self.folder / f"{self.written:02d}.pt")
            self.written += 1
        self.paused += time.perf_counter() - now
        return not self.times


# the two sides, each in its own process ----------------------------------------------------------


def train_config(overrides: list[str]) -> TrainConfig:
    """train.py's config with the given overrides (the metrics.* ones excluded), checked as train.py checks it:
    gan.compose_config, its types by Hydra and OmegaConf, its ranges by gan/config.py."""
    try:
        return compose_config(*[o for o in overrides if not o.startswith("metrics.")])
    except ConfigError as err:  # a bad override, in one paragraph
        raise ConfigError(f"The overrides {' '.join(overrides)} do not make a train.py config: {err}") from None


def metrics_config(overrides: list[str]) -> MetricsConfig:
    """evaluate.py's metrics settings with the metrics.* overrides among `overrides`."""
    dotlist = [o.split(".", 1)[1] for o in overrides if o.startswith("metrics.")]
    try:
        metrics = OmegaConf.to_object(
            OmegaConf.merge(OmegaConf.structured(MetricsConfig), OmegaConf.from_dotlist(dotlist))
        )
    except OmegaConfBaseException as err:  # an unknown key or a wrong type
        raise ConfigError(f"A metrics.* override is not one evaluate.py takes: {err}") from None
    assert isinstance(metrics, MetricsConfig)
    return metrics


def run_project(cfg: TrainConfig, out: Path, times: list[float]) -> dict[str, Any]:
    """The real train() loop with the budget's clock as its after_step; snapshots hold what
    evaluate.py rebuilds G from (config, G, G_ema, num_classes)."""
    budget = Budget(times, out / "snapshots")

    def after_step(state: TrainingState) -> bool:
        def snapshot() -> dict[str, Any]:
            ema = state.G_ema.state_dict() if state.G_ema is not None else None
            weights = {"G": state.G.state_dict(), "G_ema": ema, "num_classes": state.G.num_classes}
            return {"config": to_plain(cfg), **weights}

        return budget.tick(state.step, snapshot, last=state.step >= cfg.trainer.max_steps)

    result = train(cfg, out / "run", after_step=after_step)
    return {"iterations": result.step, "snapshots": budget.written}


def run_canonical(cfg: TrainConfig, out: Path, times: list[float], workers: int) -> dict[str, Any]:
    """main.py's loop on the same training split (uint8, already at data.image_size)."""
    data = load_dataset(cfg.data, in_memory=True)
    nc, size = data.images.size(1), data.images.size(-1)
    shape = {"nz": canonical.NZ, "ngf": canonical.NGF, "nc": nc, "image_size": size}
    budget = Budget(times, out / "snapshots")

    def after_step(netG: nn.Module, step: int) -> bool:
        return budget.tick(step, lambda: {"netG": netG.state_dict(), "shape": shape})

    device = str(resolve_device(cfg.trainer.device))
    _, iterations = canonical.train(data.images, data.labels, out / "run", after_step, cfg.trainer.seed, device,
                                    workers=workers)  # fmt: skip
    return {"iterations": iterations, "snapshots": budget.written}


def side_main(args: argparse.Namespace) -> None:
    """One side's training, in this (fresh) process; writes OUT/SIDE/side.json."""
    cfg = train_config(args.overrides + ["trainer.progress=false"])
    if args.threads:
        torch.set_num_threads(args.threads)
        cfg.trainer.threads = args.threads
    out, times = args.out / args.side, snapshot_times(args.budget_s)
    if args.side == "project":
        about = run_project(cfg, out, times)
    else:
        about = run_canonical(cfg, out, times, args.canonical_workers)
    (out / "side.json").write_text(json.dumps(about))


# load from outside: CPU seconds that other processes used while a side ran -------------------------


def run_side(side: str, args: argparse.Namespace) -> dict[str, Any]:
    """Train one side in a child process; its wall time and the cores other processes kept busy."""
    argv = [sys.executable, __file__, "--side", side, "--out", str(args.out), "--budget-s", str(args.budget_s),
            "--threads", str(args.threads), "--canonical-workers", str(args.canonical_workers),
            *args.overrides]  # fmt: skip
    log.info("Training the %s side for %.0f s of training time ...", side, args.budget_s)
    busy, started = machine_busy_seconds(), time.perf_counter()
    child = subprocess.Popen(argv)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"compare: the {side} side failed (exit {os.waitstatus_to_exitcode(status)}); see above")
    about = json.loads((args.out / side / "side.json").read_text())
    ours = usage.ru_utime + usage.ru_stime  # the child and its DataLoader workers
    end = machine_busy_seconds()
    others = None if busy is None or end is None else max(0.0, (end - busy - ours) / wall)
    return {**about, "wall_s": wall, "cpu_s": ours, "other_cores_busy": others}


# measuring the snapshots ---------------------------------------------------------------------------


METRICS = ("fid", "kid", "precision", "recall", "classes_covered")  # what a measurement reports


class Measurer:
    """evaluate.py's measurement, set up once: the held-out reference, the classifier and its features."""

    def __init__(self, cfg: TrainConfig, metrics: MetricsConfig, samples: int, seed: int, device: torch.device):
        self.config = EvaluateConfig(checkpoint="(compare)", num_samples=samples, seed=seed, metrics=metrics)
        self.device, data = device, cfg.data
        reference = load_dataset(data, train=False, in_memory=True)
        self.reals = Reals(*reference_subset(reference, samples, seed), stacked=M.is_stacked(reference))
        self.classifier, self.accuracy, self.classifier_file = classifier_for(
            data, reference, self.reals.stacked, self.config, device
        )
        if self.classifier is None:
            raise UserError(f"data={data.name} has no class labels: compare.py measures in a classifier's features")
        self.features = M.ClassifierFeatures(self.classifier, self.reals.stacked, reference.images.size(1)).to(device)
        self.real_features = M.batched(self.features, self.reals.images, self.config.batch_size, device)  # once

    def __call__(self, G: nn.Module, seed: Optional[int] = None) -> dict[str, Any]:
        """G's metrics; `seed` draws other latents (default: the measurement's seed), same held-out images."""
        cfg = self.config
        return self.score(generate(G, cfg.num_samples, cfg.batch_size, cfg.seed if seed is None else seed, self.device))

    def score(self, images: Tensor) -> dict[str, Any]:
        """The metrics of uint8 images (N, C, H, W), a G's samples or real ones, against the held-out images."""
        results = measure(self.features, self.classifier, self.reals, images, self.config, self.device,
                          real_features=self.real_features)  # fmt: skip
        return {key: results[key] for key in METRICS if key in results}


def generator_of(side: str, snapshot: dict[str, Any], measurer: Measurer, batch_statistics: bool = True) -> nn.Module:
    """The snapshot's G as each side samples it (see the module's docstring)."""
    if side == "project":
        G, _ = prepare_generator(snapshot, measurer.config, measurer.device)  # EMA, BatchNorm recomputed
        return G
    shape = snapshot["shape"]
    netG = canonical.Generator(shape["nz"], shape["ngf"], shape["nc"], shape["image_size"])
    netG.load_state_dict(snapshot["netG"])
    return canonical.Sampler(netG, shape["nz"], batch_statistics).to(measurer.device)


def measure_side(side: str, out: Path, measurer: Measurer) -> list[dict[str, Any]]:
    rows = []
    for path in sorted((out / side / "snapshots").glob("*.pt")):
        snapshot = torch.load(path, map_location="cpu", weights_only=True)
        values = measurer(generator_of(side, snapshot, measurer))
        rows.append({"side": side, "seconds": snapshot["seconds"], "step": snapshot["step"], **values})
        log.info("%-9s %7.1f s  step %6d  FID %8.2f", side, rows[-1]["seconds"], snapshot["step"], values["fid"])
    return rows


# the summary -------------------------------------------------------------------------------------


def summarise(canonical_rows: list[dict], project_rows: list[dict]) -> dict[str, float]:
    """time_to_quality and fid_at_budget_ratio (the module's docstring), and the numbers at the budget."""
    best = min(canonical_rows, key=lambda row: row["fid"])
    reached = [row for row in project_rows if row["fid"] <= best["fid"]]
    time_to_quality = best["seconds"] / reached[0]["seconds"] if reached else 0.0
    last_c, last_p = canonical_rows[-1], project_rows[-1]
    return {
        "time_to_quality": time_to_quality,
        "fid_at_budget_ratio": last_c["fid"] / last_p["fid"],
        "fid_project": last_p["fid"],
        "fid_canonical": last_c["fid"],
        "recall_project": last_p["recall"],
        "recall_canonical": last_c["recall"],
        "canonical_best_fid": best["fid"],
        "canonical_best_seconds": best["seconds"],
        "project_seconds_to_it": reached[0]["seconds"] if reached else math.inf,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| side | seconds | step | FID | precision | recall | classes |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        classes = "-" if r.get("classes_covered") is None else str(r["classes_covered"])
        lines.append(f"| {r['side']} | {r['seconds']:.0f} | {r['step']} | {r['fid']:.2f} | {r['precision']:.3f} "
                     f"| {r['recall']:.3f} | {classes} |")  # fmt: skip
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], summary: dict[str, float], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for side, label in (("canonical", "canonical DCGAN (examples/dcgan/main.py)"), ("project", "this project")):
        mine = [r for r in rows if r["side"] == side]
        (line,) = ax.plot([r["seconds"] for r in mine], [r["fid"] for r in mine], marker="o", label=label)
        end = max(r["seconds"] for r in rows)
        if mine and mine[-1]["seconds"] < end / 1.05:  # the run ended before the budget: its last G stays
            ax.plot([mine[-1]["seconds"], end], [mine[-1]["fid"]] * 2, linestyle="--", color=line.get_color())
    ax.axhline(summary["canonical_best_fid"], color="grey", linestyle=":", linewidth=1)
    ax.set(xscale="log", yscale="log", xlabel="training wall time (s)", ylabel="FID (held-out, classifier features)")
    seconds = [r["seconds"] for r in rows]
    ax.set_xticks(
        [
            t
            for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
            if min(seconds) / 1.5 <= t <= max(seconds) * 1.5
        ]
    )
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers (20, not 2 x 10^1), and no labels on minor ticks
        axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def summary_line(summary: dict[str, float]) -> str:
    keys = ("time_to_quality", "fid_at_budget_ratio", "fid_project", "fid_canonical", "recall_project",
            "recall_canonical")  # fmt: skip
    return " ".join(f"{key}={summary[key]:.3g}" for key in keys)


def main(args: argparse.Namespace) -> None:
    cfg = train_config(args.overrides)  # a bad override fails here, before any training
    metrics = metrics_config(args.overrides)
    stamp = f"{cfg.data.name.value}-{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}"
    args.out = args.out or Path("outputs/compare") / stamp
    taken = [side for side in SIDES if (args.out / side).exists()]
    if taken and not args.measure_only:
        raise UserError(f"{args.out} already holds a comparison ({', '.join(taken)}): give another --out, "
                        "or --measure-only to measure its snapshots again")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {} if args.measure_only else {side: run_side(side, args) for side in SIDES}
    if args.threads:
        torch.set_num_threads(args.threads)
    measurer = Measurer(cfg, metrics, args.samples, cfg.trainer.seed, resolve_device(cfg.trainer.device))
    rows = {side: measure_side(side, args.out, measurer) for side in SIDES}
    if not rows["canonical"] or not rows["project"]:
        raise SystemExit(f"compare: no snapshots under {args.out}/canonical or /project to measure")
    last = sorted((args.out / "canonical" / "snapshots").glob("*.pt"))[-1]
    eval_mode = measurer(generator_of("canonical", torch.load(last, weights_only=True), measurer, False))
    summary = summarise(rows["canonical"], rows["project"])
    every = rows["canonical"] + rows["project"]
    title = f"data={cfg.data.name.value}, {cfg.data.image_size} px, {args.budget_s:.0f} s a side, "
    title += f"{args.samples} samples"
    plot(every, summary, title, args.out / "fid_vs_time.png")
    result = {"summary": summary, "rows": every, "runs": runs, "canonical_last_eval_mode": eval_mode,
              "budget_s": args.budget_s, "samples": args.samples, "overrides": args.overrides,
              "classifier": measurer.classifier_file, "torch_threads": torch.get_num_threads()}  # fmt: skip
    (args.out / "compare.json").write_text(json.dumps(result, indent=1, default=float))
    print(table(every))
    for side, about in runs.items():
        others = "unknown" if about["other_cores_busy"] is None else f"{about['other_cores_busy']:.2f}"
        print(f"{side}: {about['iterations']} iterations, {about['wall_s']:.0f} s wall in all; "
              f"cores kept busy by other processes meanwhile: {others}")  # fmt: skip
    fid, recall = eval_mode["fid"], eval_mode["recall"]
    print(f"canonical at the budget with eval-mode BatchNorm: FID {fid:.2f}, recall {recall:.3f}")
    print(f"plot: {args.out / 'fid_vs_time.png'}")
    print(summary_line(summary))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="train.py overrides (data=..., model.*), evaluate.py's metrics.*")
    parser.add_argument("--budget-s", type=float, default=600.0, help="training seconds per side (default 600)")
    parser.add_argument("--samples", type=int, default=10000, help="samples per measurement, and held-out images")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default outputs/compare/DATA-TIME)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads of both sides (0: torch's default)")
    parser.add_argument("--canonical-workers", type=int, default=canonical.WORKERS, help="main.py's --workers")
    parser.add_argument("--measure-only", action="store_true", help="measure the snapshots already under --out")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # the child process of one side
    args = parser.parse_args(argv)
    if args.budget_s <= 0 or args.samples < 10:
        parser.error("--budget-s must be > 0 and --samples at least 10")
    if args.measure_only and args.out is None:
        parser.error("--measure-only needs --out, the folder of an earlier comparison")
    return args


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    arguments = parse(sys.argv[1:])
    try:
        side_main(arguments) if arguments.side else main(arguments)
    except UserError as err:
        print(f"compare: {err}", file=sys.stderr)
        raise SystemExit(2) from None
