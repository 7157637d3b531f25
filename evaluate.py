"""Evaluate a trained generator: `python evaluate.py checkpoint=PATH [key=value ...]` (pip: `dcgan-evaluate`), a
Hydra app as train.py is. FID, KID, precision/recall, density/coverage and class (or Stacked-MNIST mode) coverage
against the held-out split, in a classifier's feature space (trained offline on the labels) or Inception-v3's;
sample, interpolation and nearest-neighbour grids; optionally the samples and the exported generator: all in this
job's folder. Exit codes: 0 done; 2 bad input (an override, the config, a checkpoint, the data, a metric that
cannot be measured); 130 stopped by SIGINT (Ctrl-C), as train.py's.
"""

import contextlib
import logging
import math
import signal
import sys
from typing import Any, NoReturn, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from gan import launch
from gan.config import validate_and_check
from gan.errors import RunDirError, UserError, environment_error
from gan.run import ELSEWHERE, Run, held_log

log = logging.getLogger("evaluate")
EXIT_BAD_INPUT, EXIT_INTERRUPTED = 2, 130
IN_USE = "it is training or evaluating there). Nothing was written. Wait for it to finish, or choose another folder."


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        return launch.run_hydra(job, "evaluate", list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # while Hydra starts or winds down: nothing of the job's
        log.warning("Interrupted (SIGINT) before the evaluation began; nothing was measured.")
        return EXIT_INTERRUPTED


def job(cfg: DictConfig) -> tuple[int, float]:
    from gan.evaluation.pipeline import evaluate, interrupted  # torch: the job's import, not --help's or a TAB's

    hydra, results = HydraConfig.get(), None
    run = Run(hydra.runtime.output_dir)
    named = "hydra.run.dir" in {launch.override_key(o) for o in hydra.overrides.hydra}
    with held_log() as run_log, contextlib.ExitStack() as held:
        try:
            held.enter_context(run.owned(IN_USE))  # one evaluation per folder, as one run per run folder
            run.check_writable()  # a full disk or a read-only folder: said before minutes of measuring
            if run.metrics.is_file():
                raise RunDirError(
                    f"{run.dir} already holds an evaluation (metrics.json). Nothing was written. {ELSEWHERE}"
                )
            if named and (problem := run.existing_run()):
                raise RunDirError(problem)
            held.callback(keep_record, run, cfg, run_log)  # runs before the lock is released
            results = evaluate(validate_and_check(cfg), run.dir, launch.data_overrides(cfg, hydra.overrides.task))
        except KeyboardInterrupt:  # Ctrl-C: one line saying what was saved, not a traceback
            log.warning("%s", interrupted(run.dir))
            return EXIT_INTERRUPTED, math.nan
        except (UserError, OSError) as err:
            if isinstance(err, OSError):  # disk full, permissions: the environment, not a bug
                # metrics.json is written before the events: a folder holding it is refused
                again = f"evaluate again into another folder ({run.metrics} holds this one's numbers)."
                err = environment_error(err, then=again if run.metrics.is_file() else "run the same command again.")
            if hydra.mode == RunMode.MULTIRUN:  # Hydra records the failed job, and the sweep goes on
                raise launch.SweepJobFailed(str(err)) from err
            log.error("%s", err)
            return EXIT_BAD_INPUT, math.nan
        finally:
            if results is None and not run.outputs():
                held.close()
                run.remove_if_empty()
    log.info("Done in %.0f s; outputs in %s", results["seconds"]["total"], run.dir)
    return 0, results["fid"]


def keep_record(run: Run, cfg: DictConfig, run_log: Any) -> None:
    """The record and log beside an evaluation's outputs, once there are any (a full disk: the error said so)."""
    if run.outputs():
        with contextlib.suppress(OSError):
            run.keep_record(cfg, run_log)


def cli(program: str = "python evaluate.py") -> NoReturn:
    # Ctrl-C interrupts even when this process was started with SIGINT ignored (`cmd &` in a shell)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    launch.start("evaluate", main, program)


if __name__ == "__main__":
    cli()
