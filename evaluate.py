"""Evaluate a trained generator: `python evaluate.py checkpoint=PATH [key=value ...]`; see configs/evaluate.yaml.

Measures FID, KID, precision/recall, density/coverage and class (or Stacked-MNIST mode) coverage
against the held-out split, in the feature space of a classifier trained on the dataset's labels
(offline) or of Inception-v3; draws sample, interpolation and nearest-neighbour grids; optionally
saves the samples and exports the generator. Everything goes into this run's directory:
metrics.json, *.png, tb/, export/. `main(argv)` runs the command line in this process and returns
its exit code, as train.py's does. Installed with pip, the same program is the command `dcgan-evaluate`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from gan import runs
from gan.config import register_evaluate_configs, validate_evaluate
from gan.errors import RunDirError, UserError, environment_error
from gan.evaluation.pipeline import evaluate

log = logging.getLogger("evaluate")

# Exit codes: 0 done; 2 bad input (an override Hydra refuses, config, checkpoint, data, a metric that
# cannot be measured); 130 stopped by SIGINT (Ctrl-C), as train.py's.
EXIT_BAD_INPUT, EXIT_INTERRUPTED = 2, 130
_run_dir: Optional[Path] = None  # this job's folder once Hydra has made it: what an interruption reports on


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python evaluate.py ARGV`, in this process: the exit code."""
    global _run_dir
    argv, _run_dir = list(sys.argv[1:] if argv is None else argv), None
    register_evaluate_configs()
    problem = runs.preflight(argv, resumable=False, config_name="evaluate")
    if problem:
        log.error("%s", problem)
        return EXIT_BAD_INPUT
    try:
        return runs.run_hydra(job, "evaluate", argv)
    except KeyboardInterrupt:  # while Hydra starts, or winds down after the job
        log.warning("%s", interrupted(_run_dir))
        return EXIT_INTERRUPTED


# A training run or another evaluation holds the folder: what to do instead
IN_USE = "it is training or evaluating there). Nothing was written. Wait for it to finish, or choose another folder."


def job(cfg: DictConfig) -> tuple[int, float]:
    global _run_dir
    run_dir = _run_dir = Path(HydraConfig.get().runtime.output_dir)
    named = "hydra.run.dir" in {runs.override_key(o) for o in HydraConfig.get().overrides.hydra}
    with runs.held_log() as run_log:  # the record and log file go beside the outputs once there are any
        try:
            lock = runs.take_lock(run_dir, IN_USE)  # one evaluation per folder, as one run per run folder
        except RunDirError as err:
            log.error("%s", err)
            return EXIT_BAD_INPUT, math.nan
        problem = existing_evaluation(run_dir) or (runs.existing_run(run_dir) if named else None)
        try:
            if problem:
                raise RunDirError(problem)
            results = evaluate(validate_evaluate(cfg), run_dir, data_overrides(cfg))
        except KeyboardInterrupt:  # Ctrl-C: one line saying what was saved, not a traceback
            log.warning("%s", interrupted(run_dir))
            return EXIT_INTERRUPTED, math.nan
        except (UserError, OSError) as err:
            if isinstance(err, OSError):  # disk full, permissions: the environment, not a bug
                written = run_dir / "metrics.json"  # written before the events: a folder holding it is refused
                again = f"evaluate again into another folder ({written} holds this one's numbers)."
                err = environment_error(err, then=again if written.is_file() else "run the same command again.")
            if HydraConfig.get().mode == RunMode.MULTIRUN:  # Hydra prints it and runs the other jobs
                raise runs.SweepJobFailed(str(err)) from err
            log.error("%s", err)
            return EXIT_BAD_INPUT, math.nan
        finally:
            outputs = [p for p in run_dir.iterdir() if p.name != runs.LOCK_FILE] if run_dir.is_dir() else []
            if problem is None and outputs:  # never into a run's record
                with contextlib.suppress(OSError):  # a full disk: the error said so already
                    runs.keep_record(run_dir, cfg, run_log)
            runs.release_lock(lock, run_dir)
            if problem is not None or not outputs:
                runs.remove_if_empty(run_dir)
        log.info("Done in %.0f s; outputs in %s", results["seconds"]["total"], run_dir)
    return 0, results["fid"]


def existing_evaluation(run_dir: Path) -> Optional[str]:
    """An evaluation's folder holding a finished one: its metrics.json would be replaced, its pictures mixed."""
    if not (run_dir / "metrics.json").is_file():
        return None
    return (
        f"{run_dir} already holds an evaluation (metrics.json): a second one there would replace its numbers and "
        "mix its pictures and TensorBoard events with the first's. Nothing was written. Choose another "
        "hydra.run.dir, or move that folder away."
    )


def interrupted(run_dir: Optional[Path]) -> str:
    """The line an interrupted evaluation ends with, saying what run_dir holds by then. metrics.json is
    written after every measurement and picture, before TensorBoard's events (pipeline.report)."""
    if run_dir is None:
        return "Interrupted (SIGINT) before the evaluation began; nothing was measured."
    names = [p.name for p in run_dir.iterdir()] if run_dir.is_dir() else []
    outputs = sorted(name for name in names if not name.startswith(".") and not name.endswith(".log"))
    if "metrics.json" in outputs:
        return (
            f"Interrupted (SIGINT) after the metrics were saved to {run_dir / 'metrics.json'}; "
            f"the TensorBoard events in {run_dir / 'tb'} may be incomplete."
        )
    partial = f", only partial outputs ({', '.join(outputs)})" if outputs else ""
    return f"Interrupted (SIGINT); nothing measured was saved: {run_dir} holds no metrics.json{partial}."


def data_overrides(cfg: DictConfig) -> dict[str, Any]:
    """The data.* keys given on the command line, with the values Hydra typed: they replace the
    checkpoint's own; everything else about the data comes from the checkpoint."""
    given = {runs.override_key(o) for o in HydraConfig.get().overrides.task}
    keys = [key.split(".", 1)[1] for key in given if key.startswith("data.")]
    return {key: OmegaConf.to_container(cfg.data, resolve=True)[key] for key in keys}


def cli() -> None:
    """The program: `python evaluate.py`, or the command pip installs (`dcgan-evaluate`, gan/cli.py)."""
    logging.basicConfig(level=logging.INFO, format="[%(name)s][%(levelname)s] - %(message)s")  # until Hydra's
    # Ctrl-C interrupts even when this process was started with SIGINT ignored (`cmd &` in a shell)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())


if __name__ == "__main__":
    cli()
