"""A sweep at a glance: one row per run, the settings that differ and each run's result, best first.

    python scripts/sweep_table.py outputs/multirun/2026-11-24/16-03-58 [--plot sweep.png]

Any folder of runs works (`outputs`: every run under it). Each run is read from its `tb/` events, as
TensorBoard reads them: the settings of its HParams session (the compared settings every run reports,
and its own overrides: gan/training/loop.py:hparams_of), `FID/best` and the step of the lowest
`quality/FID` (trainer.eval_every: the generator in checkpoints/best.pt) and `FID/final`
(trainer.final_eval_samples: evaluate.py's FID of the last checkpoint); the recall is the final
evaluation's (RUN_DIR/eval/metrics.json), else the last in-training `quality/recall`. Rows are
sorted by best FID, else final FID; a run without either comes last. Settings the same in every run
are printed once above the table. `--plot` draws each run's best and final FID as dots on one axis,
labelled by the settings that differ.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # gan/, when run from anywhere
from gan.training.loop import BEST_FID_TAG, FID_TAG, FINAL_FID_TAG  # noqa: E402

RECALL_TAG = "quality/recall"


def read_run(tb: Path) -> dict:
    """{'settings': {key: value}, 'best', 'best_step', 'final', 'recall', 'step'} of one run's events."""
    events = EventAccumulator(str(tb), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    content = events.PluginTagToContent(metadata.PLUGIN_NAME).get(metadata.SESSION_START_INFO_TAG)
    settings = {}
    if content is not None:
        for key, value in metadata.parse_session_start_info_plugin_data(content).hparams.items():
            settings[key] = getattr(value, value.WhichOneof("kind"))
    scalars = events.Tags()["scalars"]

    def last(tag: str) -> float:
        return events.Scalars(tag)[-1].value if tag in scalars else math.nan

    steps = [events.Scalars(tag)[-1].step for tag in scalars]
    recall = last(RECALL_TAG)
    metrics = tb.parent / "eval" / "metrics.json"
    if metrics.is_file():
        recall = float(json.loads(metrics.read_text()).get("recall", math.nan))
    curve = events.Scalars(FID_TAG) if FID_TAG in scalars else []
    lowest = min(curve, key=lambda event: event.value, default=None)  # FID/best's step: the curve's lowest point
    return {
        "settings": settings,
        "best": last(BEST_FID_TAG),
        "best_step": math.nan if lowest is None else lowest.step,
        "final": last(FINAL_FID_TAG),
        "recall": recall,
        "step": max(steps, default=0),
    }


def find_runs(folder: Path) -> dict[str, dict]:
    """Every run under `folder` (a `tb/` with events), by its folder's path under `folder`."""
    runs = {}
    for tb in sorted({events.parent for events in folder.rglob("events.out.tfevents.*")}):
        if tb.name == "tb":
            runs[tb.parent.relative_to(folder).as_posix() or "."] = read_run(tb)
    return runs


def rank(row: dict) -> tuple:
    for key in ("best", "final"):
        if not math.isnan(row[key]):
            return (0, row[key])
    return (1, 0.0)


def table(runs: dict[str, dict]) -> tuple[list[str], list[str], list[list[str]]]:
    """(the settings the same in every run as `key=value`, the header, one row per run, best first)."""
    keys = list(dict.fromkeys(key for row in runs.values() for key in sorted(row["settings"])))
    values = {key: {str(row["settings"].get(key, "-")) for row in runs.values()} for key in keys}
    varying = [key for key in keys if len(values[key]) > 1]
    constant = [f"{key}={values[key].pop()}" for key in keys if len(values[key]) == 1]
    header = ["run", *varying, "FID best", "at step", "FID final", "recall", "steps"]
    rows = []
    for name, row in sorted(runs.items(), key=lambda item: rank(item[1])):
        numbers = [format_number(row[key]) for key in ("best", "best_step", "final", "recall", "step")]
        rows.append([name, *(str(row["settings"].get(key, "-")) for key in varying), *numbers])
    return constant, header, rows


def format_number(value: float | int) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def plot(runs: dict[str, dict], varying: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    ordered = sorted(runs.items(), key=lambda item: rank(item[1]), reverse=True)  # best at the top
    labels = [", ".join(f"{k}={row['settings'].get(k, '-')}" for k in varying) or name for name, row in ordered]
    figure, axis = plt.subplots(figsize=(8, 1 + 0.4 * len(ordered)))
    y = list(range(len(ordered)))
    axis.scatter([row["best"] for _, row in ordered], y, label="best in-training FID (best.pt)", marker="o")
    axis.scatter([row["final"] for _, row in ordered], y, label="final FID (evaluate.py)", marker="x")
    axis.set_yticks(y, labels)
    axis.set_xlabel("FID (lower is better)")
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "folder", type=Path, help="a sweep's folder (outputs/multirun/DATE/TIME), or any folder of runs"
    )
    parser.add_argument("--plot", type=Path, help="also draw best and final FID per run into this PNG")
    args = parser.parse_args()
    runs = find_runs(args.folder)
    if not runs:
        print(f"No runs under {args.folder}: no tb/ folder with TensorBoard events.", file=sys.stderr)
        return 2
    constant, header, rows = table(runs)
    if constant:
        print("the same in every run: " + "  ".join(constant))
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    for line in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    if args.plot:
        plot(runs, header[1:-5], args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
