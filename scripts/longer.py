"""Training longer: does a recipe hold its quality at 2x, 4x and 10x its trainer.max_steps?

    python scripts/longer.py                                   # digits, the default run trained to 10x
    python scripts/longer.py --factor 4 --every 1000 loss.r1=1 model.d_batchnorm=false
    python scripts/longer.py data=fashion_mnist data.root=/path/to/datasets \
        metrics.classifier.epochs=5 metrics.classifier.min_accuracy=0.9
    python scripts/longer.py --out DIR --measure-only          # (re)measure the snapshots under DIR
    python scripts/longer.py --out DIR --extend --factor 4     # train an earlier run on, to 4x
    python scripts/longer.py --plot old=DIR new=DIR --out FILE.png   # several runs' curves on one plot

Trains `python train.py` with the overrides given (train.py's keys; `metrics.*` are evaluate.py's
measurement settings) through `--factor` x its trainer.max_steps in one run, as a user who sets
trainer.max_steps larger would (optim.lr_decay, when set, plans toward that end), and snapshots the
generator every `--every` steps. `--extend` trains an earlier run under --out (also one cut off
part-way: a crash, a killed job) on to a larger `--factor`: it resumes the run's last checkpoint
exactly, with the settings stored in it (so a default changed since does not change the run), as
`train.py trainer.resume=DIR/run trainer.max_steps=N` would; without optim.lr_decay that is the
same run as one started with the larger factor. Each snapshot is then measured as evaluate.py
measures a checkpoint (the EMA generator with its BatchNorm statistics recomputed, `--samples`
samples against as many held-out images, in the classifier's features), `--draws` times with other
latents against the same held-out images, and the draws averaged: below FID ~1 one draw's noise is
larger than the bar's 10%.

Prints a table (step, multiple of the configured max_steps, FID, recall, and each against the best
seen at or before it), then the data's own score (as many real training images, measured as a
snapshot is, against the same held-out images: the floor below which a snapshot's differences are
the estimator's noise; "reals" in longer.json), writes OUT/longer.json and OUT/fid_vs_steps.png,
and ends with one line:
    holds=B worst_fid_ratio=X worst_recall_ratio=Y best_fid=Z best_step=N draws=D [at_Mx=F/R ...]
worst_fid_ratio: the largest FID / (best FID at or before that step) over the snapshots from 2x the
configured max_steps on; worst_recall_ratio likewise the smallest recall / best recall before it;
holds = worst_fid_ratio <= 1.1 and worst_recall_ratio >= 0.9 (the bar of docs/results.md,
"Training longer", at every snapshot). at_Mx=F/R: the same two ratios of the snapshot at exactly
M x max_steps, for M = 2, 4, 10 where there is one; longer.json's summary has holds_at_multiples:
the FID ratios at those lengths <= 1.1 and worst_recall_ratio >= 0.9.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repo's gan and scripts

from omegaconf import OmegaConf  # noqa: E402

from gan.checkpoint import load_checkpoint, require_training_state, stored_config  # noqa: E402
from gan.config import TrainConfig, to_plain, validate  # noqa: E402
from gan.data import load_dataset  # noqa: E402
from gan.device import resolve_device  # noqa: E402
from gan.errors import UserError  # noqa: E402
from gan.evaluation.pipeline import reference_subset  # noqa: E402
from gan.training import train  # noqa: E402
from gan.training.state import TrainingState  # noqa: E402
from scripts.compare import METRICS, Measurer, generator_of, metrics_config, train_config  # noqa: E402

log = logging.getLogger("longer")
FID_BAR, RECALL_BAR = 1.1, 0.9  # no worse than 1.1x the best FID before; recall at least 0.9x its best
MULTIPLES = (2, 4, 10)  # the lengths, in trainer.max_steps, at which the bar is also read on its own


def train_longer(cfg: TrainConfig, factor: float, every: int, out: Path, threads: int) -> None:
    """One run of cfg through factor x its configured max_steps; G snapshots every `every` steps into
    OUT/snapshots."""
    cfg.trainer.max_steps = int(round(cfg.trainer.max_steps * factor))
    cfg.trainer.progress = False
    snapshot_and_train(cfg, every, out, threads)


def extend_longer(about: dict[str, Any], factor: float, every: int, out: Path, threads: int) -> None:
    """The run under OUT/run resumed from its last checkpoint, with the config stored in it, and
    trained on to factor x its configured max_steps (about["base_steps"])."""
    file = out / "run" / "checkpoints" / "last.pt"
    if not file.is_file():
        raise UserError(f"--extend: {file} does not exist: {out} holds no run to train on")
    state = load_checkpoint(file)
    require_training_state(state, str(file))
    cfg = validate(OmegaConf.merge(OmegaConf.structured(TrainConfig), stored_config(state["config"], file)))
    cfg.trainer.max_steps = int(round(about["base_steps"] * factor))
    if cfg.trainer.max_steps <= int(state["step"]):
        raise UserError(f"--extend --factor {factor}: step {cfg.trainer.max_steps} is not beyond the run's "
                        f"step {state['step']}; give a larger --factor")  # fmt: skip
    cfg.trainer.resume, cfg.trainer.progress = str(file), False
    snapshot_and_train(cfg, every, out, threads)


def snapshot_and_train(cfg: TrainConfig, every: int, out: Path, threads: int) -> None:
    """train() into OUT/run, G (and its EMA) saved into OUT/snapshots every `every` steps and at the end."""
    if threads:
        torch.set_num_threads(threads)
        cfg.trainer.threads = threads
    folder = out / "snapshots"
    folder.mkdir(parents=True, exist_ok=True)

    def after_step(state: TrainingState) -> bool:
        if state.step % every == 0 or state.step == cfg.trainer.max_steps:
            ema = state.G_ema.state_dict() if state.G_ema is not None else None
            snapshot = {"config": to_plain(cfg), "G": state.G.state_dict(), "G_ema": ema}
            torch.save({**snapshot, "num_classes": state.G.num_classes, "step": state.step},
                       folder / f"step_{state.step:07d}.pt")  # fmt: skip
        return False

    train(cfg, out / "run", after_step=after_step)


def measurer_for(overrides: list[str], samples: int) -> Measurer:
    """evaluate.py's measurement for the run's data, set up once for the snapshots and the real images."""
    cfg = train_config(overrides)
    return Measurer(cfg, metrics_config(overrides), samples, cfg.trainer.seed, resolve_device(cfg.trainer.device))


def measure_all(out: Path, measurer: Measurer, draws: int = 1) -> list[dict[str, Any]]:
    """Every snapshot under OUT/snapshots measured `draws` times, each draw with its own latents (seeds
    trainer.seed, trainer.seed + 1, ...) against the same held-out images; a row's values are the
    mean of its first `draws` draws, with fid_sd their spread. Draws kept in OUT/rows.json are not
    measured again: a larger --draws measures only the missing ones.

    Why draws: below FID ~1 (digits) one snapshot's FID moves by about +-0.07 from one draw of 5,000
    latents to another, more than the bar's 10%; the mean of three draws is sqrt(3) steadier, and
    the same held-out images on every draw keep the snapshots' comparison paired."""
    cache = out / "rows.json"
    stored = json.loads(cache.read_text()) if cache.exists() else []
    # rows of one draw, from before --draws, hold their values at the top level: that is draw 0
    found = {row["step"]: row.get("draws") or [{k: row[k] for k in METRICS if k in row}] for row in stored}
    for path in sorted((out / "snapshots").glob("step_*.pt")):
        step = int(path.stem.split("_")[1])
        done = found.setdefault(step, [])
        if len(done) >= draws:
            continue
        snapshot = torch.load(path, map_location="cpu", weights_only=True)
        G = generator_of("project", snapshot, measurer)
        for draw in range(len(done), draws):
            values = measurer(G, seed=measurer.config.seed + draw)
            done.append({k: float(v) for k, v in values.items() if v is not None})
            log.info("step %7d  draw %d  FID %8.2f  recall %.3f", step, draw, values["fid"], values["recall"])
        cache.write_text(json.dumps([{"step": s, "draws": found[s]} for s in sorted(found)], indent=1))
    return [mean_row(step, found[step][:draws]) for step in sorted(found) if found[step]]


def reals_row(overrides: list[str], measurer: Measurer, draws: int) -> dict[str, Any]:
    """The data's own score: as many real training images as the measurer's samples (a seeded subset
    per draw) measured as a snapshot is, against the same held-out images. A generator at this FID is
    as close to the held-out images as the training images are; below it a snapshot's differences
    are the estimator's noise."""
    cfg = train_config(overrides)
    training = load_dataset(cfg.data, train=True)
    found = []
    for draw in range(draws):
        images, _ = reference_subset(training, measurer.config.num_samples, cfg.trainer.seed + draw,
                                     split="training split")  # fmt: skip
        found.append({k: float(v) for k, v in measurer.score(images).items() if v is not None})
    return mean_row(0, found)


def mean_row(step: int, draws: list[dict[str, float]]) -> dict[str, Any]:
    """One snapshot's row: each metric's mean over the draws, the FID's sample standard deviation, and the draws."""
    row: dict[str, Any] = {"step": step, "draws": draws}
    for key in METRICS:
        if all(key in d for d in draws):
            row[key] = sum(d[key] for d in draws) / len(draws)
    fids = [d["fid"] for d in draws]
    row["fid_sd"] = statistics.stdev(fids) if len(fids) > 1 else 0.0
    return row


def against_best(rows: list[dict[str, Any]], base: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Each row with the best FID and recall seen at or before it, and the summary of the module's docstring."""
    best_fid, best_recall = float("inf"), 0.0
    worst_fid, worst_recall = 0.0, float("inf")
    for row in rows:
        best_fid, best_recall = min(best_fid, row["fid"]), max(best_recall, row["recall"])
        row.update(times=row["step"] / base, fid_vs_best=row["fid"] / best_fid,
                   recall_vs_best=row["recall"] / best_recall if best_recall > 0 else 0.0)  # fmt: skip
        if row["step"] >= 2 * base:
            worst_fid, worst_recall = max(worst_fid, row["fid_vs_best"]), min(worst_recall, row["recall_vs_best"])
    best = min(rows, key=lambda r: r["fid"])
    late = any(row["step"] >= 2 * base for row in rows)  # without a snapshot from 2x on there is no verdict
    holds = float(worst_fid <= FID_BAR and worst_recall >= RECALL_BAR) if late else float("nan")
    if not late:
        worst_fid = worst_recall = float("nan")
    summary = {"holds": holds, "worst_fid_ratio": worst_fid, "worst_recall_ratio": worst_recall,
               "best_fid": best["fid"], "best_step": best["step"],
               "draws": min(len(r.get("draws", [r])) for r in rows)}  # fmt: skip
    # the bar read at the lengths it names: FID at 2x, 4x and 10x against the best before, recall
    # at every snapshot from 2x on (it is to be "never" below 0.9x its best)
    at = {m: row for m in MULTIPLES for row in rows if row["step"] == m * base}
    for m, row in at.items():
        summary[f"fid_ratio_at_{m}x"], summary[f"recall_ratio_at_{m}x"] = row["fid_vs_best"], row["recall_vs_best"]
    fid_ok = [row["fid_vs_best"] <= FID_BAR for row in at.values()]
    summary["holds_at_multiples"] = float(all(fid_ok) and worst_recall >= RECALL_BAR) if fid_ok else float("nan")
    return rows, summary


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| step | x max_steps | draws | FID | FID sd | recall | FID / best before | recall / best before |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(f"| {r['step']} | {r['times']:.2f} | {len(r['draws'])} | {r['fid']:.2f} | {r['fid_sd']:.2f} "
                     f"| {r['recall']:.3f} | {r['fid_vs_best']:.2f} | {r['recall_vs_best']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], base: int, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in rows], [r["fid"] for r in rows], marker="o", markersize=3)
    ax.axvline(base, color="grey", linestyle=":", label="configured max_steps")
    ax.set(xlabel="step", ylabel="FID (classifier features)", yscale="log", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_runs(runs: list[str], path: Path) -> None:
    """FID and recall against steps of several earlier runs (NAME=DIR, each DIR holding longer.json)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (fid_ax, recall_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    for run in runs:
        name, _, folder = run.partition("=")
        if not (name and folder):
            raise UserError(f"--plot {run}: each run is NAME=DIR, a label and the --out folder of an earlier run")
        result_file = Path(folder) / "longer.json"
        if not result_file.exists():
            raise UserError(f"--plot {run}: {result_file} does not exist (run scripts/longer.py --out {folder} first)")
        result = json.loads(result_file.read_text())
        rows, reals = result["rows"], result.get("reals")  # reals: the data's own score (runs measured since)
        steps = [r["step"] for r in rows]
        (line,) = fid_ax.plot(steps, [r["fid"] for r in rows], marker="o", markersize=3, label=name)
        recall_ax.plot(steps, [r["recall"] for r in rows], marker="o", markersize=3, label=name)
        if reals:
            for ax, key in ((fid_ax, "fid"), (recall_ax, "recall")):
                ax.axhline(reals[key], color=line.get_color(), linestyle="--", linewidth=0.8)
    if any(line.get_linestyle() == "--" for line in fid_ax.get_lines()):
        fid_ax.plot([], [], color="grey", linestyle="--", linewidth=0.8, label="real training images (dashed)")
    fid_ax.set(xlabel="step", ylabel="FID (classifier features)", yscale="log")
    recall_ax.set(xlabel="step", ylabel="recall")
    # the legend below both plots, where it hides no curve
    handles, labels = fid_ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(handles), 3), frameon=False)
    fig.tight_layout(rect=(0, 0.06 * (1 + (len(handles) - 1) // 3), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_line(summary: dict[str, float]) -> str:
    holds = "n/a" if math.isnan(summary["holds"]) else bool(summary["holds"])  # n/a: no snapshot from 2x on
    return (f"holds={holds} worst_fid_ratio={summary['worst_fid_ratio']:.3g} "
            f"worst_recall_ratio={summary['worst_recall_ratio']:.3g} best_fid={summary['best_fid']:.3g} "
            f"best_step={summary['best_step']} draws={summary['draws']}"
            + "".join(f" at_{m}x={summary[f'fid_ratio_at_{m}x']:.3g}/{summary[f'recall_ratio_at_{m}x']:.3g}"
                      for m in MULTIPLES if f"fid_ratio_at_{m}x" in summary))  # fmt: skip


def main(args: argparse.Namespace) -> None:
    if args.plot:
        plot_runs(args.plot, args.out)
        print(f"plot: {args.out}")
        return
    cfg = train_config(args.overrides)  # a bad override fails here, before any training
    metrics_config(args.overrides)
    args.out = args.out or Path("outputs/longer") / f"{cfg.data.name.value}-{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}"
    about_file = args.out / "about.json"
    if args.extend:
        if not about_file.exists():
            raise UserError(f"--extend: {args.out} holds no run of scripts/longer.py (no about.json)")
        about = json.loads(about_file.read_text())
        extend_longer(about, args.factor, args.every, args.out, args.threads)
        about_file.write_text(json.dumps({**about, "factor": args.factor}))
    elif not args.measure_only:
        if (args.out / "snapshots").exists():
            raise UserError(f"{args.out} already holds a run: give another --out, or --measure-only")
        # about.json goes first: a run cut off part-way (a crash, a killed job) can then be trained on
        # from its last checkpoint with --extend, and its snapshots measured with --measure-only
        args.out.mkdir(parents=True, exist_ok=True)
        about = {"base_steps": cfg.trainer.max_steps, "overrides": args.overrides, "factor": args.factor}
        about_file.write_text(json.dumps(about))
        train_longer(cfg, args.factor, args.every, args.out, args.threads)
    if not about_file.exists():
        raise UserError(f"{args.out} holds no run of scripts/longer.py (no about.json)")
    about = json.loads(about_file.read_text())
    if args.threads:
        torch.set_num_threads(args.threads)
    # measurement settings given now (metrics.*) join the run's own: a classifier bar can be set on a re-measure
    measuring = about["overrides"] + [o for o in args.overrides if o.startswith("metrics.")]
    measurer = measurer_for(measuring, args.samples)
    rows = measure_all(args.out, measurer, args.draws)
    if not rows:
        raise UserError(f"no snapshots under {args.out / 'snapshots'} to measure")
    rows, summary = against_best(rows, about["base_steps"])
    reals = reals_row(measuring, measurer, args.draws)
    data_name = train_config(about["overrides"]).data.name.value  # the run's data, also when extended
    title = f"data={data_name}: {' '.join(about['overrides']) or 'defaults'}"
    plot(rows, about["base_steps"], title[:90], args.out / "fid_vs_steps.png")
    (args.out / "longer.json").write_text(
        json.dumps({"summary": summary, "rows": rows, "reals": reals, **about}, indent=1)
    )
    print(table(rows))
    print(f"real training images against the same held-out images: FID {reals['fid']:.2f} (sd {reals['fid_sd']:.2f}) "
          f"recall {reals['recall']:.3f}, {len(reals['draws'])} draws")  # fmt: skip
    print(summary_line(summary))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="train.py overrides, and evaluate.py's metrics.*")
    parser.add_argument("--factor", type=float, default=10.0, help="train through this x trainer.max_steps (10)")
    parser.add_argument("--every", type=int, default=2000, help="steps between snapshots (2000)")
    parser.add_argument("--samples", type=int, default=5000, help="samples per measurement, and held-out images")
    parser.add_argument(
        "--draws", type=int, default=3, help="measurements of each snapshot, each with its own latents (3)"
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default outputs/longer/DATA-TIME)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: train.py's trainer.threads)")
    parser.add_argument("--measure-only", action="store_true", help="measure the snapshots already under --out")
    parser.add_argument("--extend", action="store_true", help="train the run under --out on to --factor, then measure")
    parser.add_argument("--plot", nargs="+", metavar="NAME=DIR", help="plot earlier runs together into --out (a PNG)")
    args = parser.parse_args(argv)
    if args.plot and (args.out is None or args.out.suffix != ".png"):
        parser.error("--plot needs --out FILE.png")
    if args.factor <= 0 or args.every < 1 or args.samples < 10 or args.draws < 1:
        parser.error("--factor must be > 0, --every at least 1, --samples at least 10 and --draws at least 1")
    if (args.measure_only or args.extend) and args.out is None:
        parser.error("--measure-only and --extend need --out, the folder of an earlier run")
    training_overrides = [o for o in args.overrides if not o.startswith("metrics.")]
    if args.extend and (args.measure_only or training_overrides):
        parser.error(
            "--extend trains the run under --out with its own settings: give no --measure-only, "
            "and no overrides but metrics.*"
        )
    return args


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    arguments = parse(sys.argv[1:])
    try:
        main(arguments)
    except UserError as err:
        print(f"longer: {err}", file=sys.stderr)
        raise SystemExit(2) from None
