"""Evaluate a trained generator. `python evaluate.py checkpoint=PATH [key=value ...]`; see configs/evaluate.yaml.

Measures FID, KID, precision/recall, density/coverage and class (or Stacked-MNIST mode) coverage
against the held-out split, in the feature space of a classifier trained on the dataset's labels
(offline) or of Inception-v3; draws sample, interpolation and nearest-neighbour grids; optionally
saves the samples and exports the generator. Everything goes into this run's directory:
metrics.json, *.png, tb/, export/.

The entry point only turns Hydra's DictConfig into a checked, typed config and hands it to
gan.evaluation.pipeline.evaluate(); it owns the exit codes, as train.py does.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import Any, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from gan.config import register_evaluate_configs, validate_evaluate
from gan.errors import UserError, environment_error
from gan.evaluation.pipeline import evaluate
from gan.training.record import HeldLog, held_log, remove_if_empty, write_record
from gan.training.runs import SweepJobFailed, override_key, preflight

log = logging.getLogger("evaluate")
register_evaluate_configs()

# Exit codes: 0 done; 2 bad input (config, checkpoint, data, a metric that cannot be measured);
# 130 stopped by SIGINT (Ctrl-C), as shells report a process that signal ended (train.py's too).
EXIT_BAD_INPUT, EXIT_INTERRUPTED = 2, 130
# This process's run directory, once Hydra has made it: what an interruption reports on.
_run_dir: Optional[Path] = None


@hydra.main(version_base="1.3", config_path="configs", config_name="evaluate")
def main(cfg: DictConfig) -> float:
    global _run_dir
    run_dir = _run_dir = Path(HydraConfig.get().runtime.output_dir)
    # Hydra writes no record and no log file (configs/evaluate.yaml): they are written beside the
    # evaluation's outputs once there are any, so a refused evaluation leaves no folder behind
    with held_log() as run_log:
        try:
            results = evaluate(validate_evaluate(cfg), run_dir, data_overrides(cfg))
        except KeyboardInterrupt:  # Ctrl-C: one line saying what was saved, not a traceback
            log.warning("%s", interrupted(run_dir))
            sys.exit(EXIT_INTERRUPTED)
        except (UserError, OSError) as err:
            if isinstance(err, OSError):  # disk full, permissions: the environment, not a bug
                err = environment_error(err)
            if HydraConfig.get().mode == RunMode.MULTIRUN:
                # Hydra records the failed job, prints this paragraph (no traceback) and runs the others
                raise SweepJobFailed(str(err)) from err
            log.error("%s", err)
            sys.exit(EXIT_BAD_INPUT)
        finally:
            keep_record(run_dir, cfg, run_log)
        log.info("Done in %.0f s; outputs in %s", results["seconds"]["total"], run_dir)
    return results["fid"]


def keep_record(run_dir: Path, cfg: DictConfig, run_log: HeldLog) -> None:
    """The evaluation's .hydra/ record and log file beside its outputs, when it wrote any; else the
    empty folder Hydra made for it is removed."""
    if run_dir.is_dir() and any(run_dir.iterdir()):
        with contextlib.suppress(OSError):  # a full disk: the error said so already
            write_record(run_dir, cfg)
            run_log.open(run_dir / f"{HydraConfig.get().job.name}.log")
    else:
        remove_if_empty(run_dir)


def interrupted(run_dir: Optional[Path]) -> str:
    """The line an interrupted evaluation ends with, saying what run_dir holds by then. metrics.json is
    written after every measurement, picture and optional output, and before TensorBoard's events
    (pipeline.report), so without it nothing measured was saved. Hydra's own files (.hydra/, the log)
    are not outputs."""
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
    checkpoint's own. Everything else about the data comes from the checkpoint."""
    given = {override_key(o) for o in HydraConfig.get().overrides.task}
    keys = [key.split(".", 1)[1] for key in given if key.startswith("data.")]
    return {key: OmegaConf.to_container(cfg.data, resolve=True)[key] for key in keys}


if __name__ == "__main__":
    # Ctrl-C interrupts, as train.py's own handler makes it do there, even when this process was
    # started with SIGINT ignored (a shell's background job, `cmd &`, passes that on to its children)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        preflight(sys.argv, EXIT_BAD_INPUT, resumable=False)
        main()
    except KeyboardInterrupt:  # outside evaluate(): while Hydra starts, or winds down after main
        log.warning("%s", interrupted(_run_dir))
        sys.exit(EXIT_INTERRUPTED)
