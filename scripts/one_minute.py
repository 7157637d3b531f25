"""Quality in one minute: train with train.py's defaults (and any overrides), press Ctrl-C 60 seconds
after the first step, and measure the checkpoint that leaves with evaluate.py.

    python scripts/one_minute.py                       # the default recipe on digits
    python scripts/one_minute.py model.g_width=32 --seconds 120
    python scripts/one_minute.py data=fashion_mnist data.root=/path/to/datasets metrics.classifier.epochs=5 \
        metrics.classifier.min_accuracy=0.9

The Ctrl-C is real: SIGINT is sent to this process, and the training loop's own handler finishes
the step, writes checkpoints/last.pt and stops, as at a terminal. The clock starts when the first
step has finished (it builds the kernels). Then evaluate.py's measurement runs on that checkpoint
with its defaults (10,000 samples of the EMA generator against 10,000 held-out images, classifier
features; metrics.* overrides as evaluate.py takes them), into RUN_DIR/eval. Prints the numbers and one line:
    one_minute steps=N seconds=S fid=F classes=C recall=R
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repo's gan and scripts

from gan.config import EvaluateConfig  # noqa: E402
from gan.errors import UserError  # noqa: E402
from gan.evaluation.pipeline import evaluate  # noqa: E402
from gan.training import train  # noqa: E402
from gan.training.state import TrainingState  # noqa: E402
from scripts.compare import metrics_config, train_config  # noqa: E402

log = logging.getLogger("one_minute")


class CtrlC:
    """after_step for train(): SIGINT to this process `seconds` after the first step finished."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.start: Optional[float] = None  # when the first step finished
        self.sent: Optional[float] = None  # seconds after it when SIGINT went out

    def __call__(self, state: TrainingState) -> bool:
        now = time.perf_counter()
        if self.start is None:
            self.start = now
        elif self.sent is None and now - self.start >= self.seconds:
            os.kill(os.getpid(), signal.SIGINT)  # the handler of gan.training.faults.stop_on_signals takes it
            self.sent = now - self.start
        return False


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="train.py overrides, and evaluate.py's metrics.*")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds after the first step (default 60)")
    parser.add_argument("--out", type=Path, default=None, help="run directory (default outputs/one_minute/TIME)")
    parser.add_argument("--samples", type=int, default=10000, help="evaluate.py's num_samples")
    args = parser.parse_args(argv)
    cfg = train_config(args.overrides + ["trainer.progress=false"])
    metrics_settings = metrics_config(args.overrides)  # a bad metrics.* override fails before training
    run_dir = args.out or Path("outputs/one_minute") / f"{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}"
    clock = CtrlC(args.seconds)
    result = train(cfg, run_dir, after_step=clock)
    seconds = clock.sent or 0.0
    if result.stopped_by != "SIGINT":
        log.warning("The run ended at trainer.max_steps=%d before the Ctrl-C", cfg.trainer.max_steps)
    measured = EvaluateConfig(checkpoint=str(result.checkpoint), num_samples=args.samples, metrics=metrics_settings)
    metrics = evaluate(measured, run_dir / "eval")
    print(f"{result.step} steps in {seconds:.1f} s after the first; stopped by {result.stopped_by or 'max_steps'}")
    print(f"one_minute steps={result.step} seconds={seconds:.1f} fid={metrics['fid']:.2f} "
          f"classes={metrics['classes_covered']} recall={metrics['recall']:.3f}")  # fmt: skip


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        main(sys.argv[1:])
    except UserError as err:
        print(f"one_minute: {err}", file=sys.stderr)
        raise SystemExit(2) from None
