"""Train a DCGAN. `python train.py [group=option] [key=value ...]`; see README.md and configs/.

The entry point only turns Hydra's DictConfig into a checked, typed config and hands it to
gan.training.train(); it owns the exit codes. Everything else lives in gan/.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from tqdm.contrib.logging import logging_redirect_tqdm

from gan.config import EvaluateConfig, TrainConfig, register_configs, to_plain, validate
from gan.distributed import broadcast_object, close, init_process_group, rank_zero_argv, world_from_env
from gan.errors import UserError, environment_error
from gan.evaluation.pipeline import evaluate
from gan.training import NonFiniteLossError, TrainResult, train
from gan.training.loop import best_checkpoint
from gan.training.monitor import write_final_numbers
from gan.training.quality import FID_TAG, QUALITY_TAGS
from gan.training.record import held_log, remove_if_empty, write_record
from gan.training.runs import (
    SweepJobFailed,
    auto_resume_in_job,
    preflight,
    resume_argv,
    resume_override,
    shell_quote,
    sweep_argv,
)

log = logging.getLogger("train")
register_configs()
CONFIG_DIR = Path(__file__).resolve().parent / "configs"

# Exit codes: 0 done; 2 bad input (config, checkpoint, data, output folder); 3 the loss became
# NaN/inf; 4 the collapse alarm stopped the run (trainer.on_collapse=stop; a sweep's job instead
# returns NaN and the sweep goes on); 128 + signal number when SIGINT/SIGTERM (or, in a SLURM job,
# submitit's time-out signal USR2/USR1) stopped the run after it wrote its checkpoint, as shells
# report a process ended by that signal.
EXIT_BAD_INPUT, EXIT_NON_FINITE, EXIT_COLLAPSE = 2, 3, 4
SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143, "SIGUSR1": 138, "SIGUSR2": 140}


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float:
    world = world_from_env()
    init_process_group(world, cfg.trainer.device)
    if not world.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # rank 0 speaks for the job
    # one run directory for the whole job: rank 0's (the others ran Hydra in '.')
    run_dir = Path(broadcast_object(HydraConfig.get().runtime.output_dir, world))
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    # Hydra writes no record and no log file (configs/train.yaml); they are written once every
    # check has passed (on_ready), so a refused command leaves every existing run as it was
    with held_log() as run_log:

        def on_ready() -> None:
            write_record(run_dir, cfg)
            run_log.open(run_dir / f"{HydraConfig.get().job.name}.log")

        try:
            with logging_redirect_tqdm():  # log lines print above the progress bar, not through it
                typed = validate(cfg)
                if multirun and typed.trainer.resume == "auto":  # a single run's was resolved before Hydra
                    typed.trainer.resume = auto_resume_in_job(run_dir, to_plain(typed))
                result = train(
                    typed, run_dir, world=world, on_ready=on_ready if world.is_main else None, command=command_line()
                )
                if world.is_main and not result.stopped_by and typed.trainer.final_eval_samples:
                    fid = final_fid(typed, result.checkpoint, run_dir, result.step)
                else:
                    fid = float("nan")
        except (UserError, NonFiniteLossError, OSError) as err:
            if isinstance(err, OSError):  # disk full, permissions: the environment, not a bug
                err = environment_error(err)
            if world.is_main:
                remove_if_empty(run_dir)  # the folder Hydra made for a refused command
            if multirun:
                # Hydra records the failed job, prints this paragraph (no traceback) and runs the others
                raise SweepJobFailed(str(err)) from err
            log.error("%s", err)
            sys.exit(EXIT_NON_FINITE if isinstance(err, NonFiniteLossError) else EXIT_BAD_INPUT)
        finally:
            close(world)
        return finish(result, fid, run_dir, multirun)  # its lines go into the run's log file too


def command_line() -> str:
    """This job's command, one run's worth: `python train.py` and the job's own overrides (a sweep
    job's values, a resume's replayed settings), each quoted for the shell; what the Text tab shows."""
    overrides = HydraConfig.get().overrides.task
    return " ".join(["python train.py", *(shell_quote(override) for override in overrides)])


def finish(result: TrainResult, fid: float, run_dir: Path, multirun: bool) -> float:
    """The run's last words and exit code: stopped by the collapse alarm or a signal, or done."""
    if result.stopped_by == "collapse":
        log.warning(
            "Stopped at step %d: D had won (trainer.on_collapse=stop). %s",
            result.step,
            outcome(result, run_dir),
        )
        if multirun:
            return float("nan")  # the sweep goes on with its other jobs
        sys.exit(EXIT_COLLAPSE)
    if result.stopped_by:
        log.warning(
            "Stopped by %s at step %d; checkpoint saved to %s. Resume with:\n  python train.py %s",
            result.stopped_by,
            result.step,
            result.checkpoint,
            resume_override(run_dir),
        )
        sys.exit(SIGNAL_EXIT[result.stopped_by])
    log.info("Done: %d steps; outputs in %s. %s", result.step, run_dir, outcome(result, run_dir))
    return fid  # what a Hydra sweeper (hparams_search=optuna) minimises; NaN without final_eval_samples


def outcome(result: TrainResult, run_dir: Path) -> str:
    """Where the run's generators are: last.pt, and best.pt with its FID and step when measured."""
    last = f"Last: {result.checkpoint}"
    fid = result.metrics.get(FID_TAG)
    last += f" (step {result.step}, in-training FID {fid:.4g})" if fid is not None else f" (step {result.step})"
    if result.best is None:
        return last + "."
    best = result.best
    return f"{last}; best: {best_checkpoint(run_dir)} (step {best['step']}, in-training FID {best['fid']:.4g})."


def final_fid(cfg: TrainConfig, checkpoint: Path, run_dir: Path, step: int) -> float:
    """evaluate.py's metrics of the finished run, into RUN_DIR/eval, and its numbers into the run's
    TensorBoard at the last step (among its HParams metrics); returns the FID."""
    eval_cfg = EvaluateConfig(
        checkpoint=str(checkpoint),
        num_samples=cfg.trainer.final_eval_samples,
        device=cfg.trainer.device,
        threads=cfg.trainer.threads,
    )
    eval_cfg.check()
    results = evaluate(eval_cfg, run_dir / "eval")
    numbers = {tag: float(results[key]) for key, tag in QUALITY_TAGS.items() if results.get(key) is not None}
    write_final_numbers(run_dir, step, numbers)
    return float(results["fid"])


if __name__ == "__main__":
    preflight(sys.argv, EXIT_BAD_INPUT)
    world = world_from_env()
    if world.distributed and ("-m" in sys.argv or "--multirun" in sys.argv):
        log.error(
            "torchrun launches one training job over several processes; a Hydra sweep (-m) "
            "launches several jobs. Run the sweep without torchrun, or one torchrun per setting."
        )
        sys.exit(EXIT_BAD_INPUT)
    try:  # the resume contract is checked here first, before Hydra and torch start (train() checks again)
        sys.argv = rank_zero_argv(sweep_argv(resume_argv(sys.argv, CONFIG_DIR), CONFIG_DIR), world)
    except UserError as err:
        log.error("%s", err)
        sys.exit(EXIT_BAD_INPUT)
    main()
