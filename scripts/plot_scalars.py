"""Plot TensorBoard scalars of several runs side by side, one panel per tag, into a PNG.

    python scripts/plot_scalars.py --runs NAME=RUN_DIR NAME=RUN_DIR \
        --tags train/d_overfit_rt train/d_heldout_gap --out FILE.png

Reads each run's `tb/` events (what train.py writes). Each point is the mean of the points logged
in the last `--window` steps (r_t is one batch's mean sign, noisy; a tag logged less often than
the window is drawn as is). Also prints each curve, every `--every`-th point, so the numbers behind
the picture can be quoted. docs/results.md's r_t figure was drawn with it.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

log = logging.getLogger("plot_scalars")


def read_scalars(run_dir: Path, tag: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one scalar tag in a run's tb/ events."""
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        raise SystemExit(f"{run_dir}: no scalar {tag!r} in its tb/ events")
    points = events.Scalars(tag)
    return [p.step for p in points], [p.value for p in points]


def running_mean(steps: list[int], values: list[float], window: int) -> list[float]:
    """At each point, the mean of the values logged in the `window` steps up to it (itself included)."""
    means = []
    for step in steps:
        recent = [v for s, v in zip(steps, values) if step - window < s <= step]
        means.append(sum(recent) / len(recent))
    return means


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True, help="NAME=RUN_DIR pairs")
    parser.add_argument("--tags", nargs="+", required=True)
    parser.add_argument("--window", type=int, default=250, help="running mean over this many steps (1 = raw)")
    parser.add_argument("--every", type=int, default=5, help="print every N-th point")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = [(pair.split("=", 1)[0], Path(pair.split("=", 1)[1])) for pair in args.runs]
    figure, axes = plt.subplots(1, len(args.tags), figsize=(5 * len(args.tags), 3.5), squeeze=False)
    for axis, tag in zip(axes[0], args.tags):
        for name, run_dir in runs:
            steps, values = read_scalars(run_dir, tag)
            smoothed = running_mean(steps, values, args.window)
            axis.plot(steps, smoothed, label=name)
            shown = "  ".join(f"{s}:{v:.3g}" for s, v in list(zip(steps, smoothed))[:: args.every])
            log.info("%s  %s  %s", tag, name, shown)
        axis.set_title(f"{tag} (mean over {args.window} steps)" if args.window > 1 else tag)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=80)
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
