"""Train a DCGAN: `python train.py [group=option] [key=value ...]` (pip installs it as `dcgan-train`), a Hydra app.
Exit codes: 0 done; 1 Hydra's own (a sweep with a failed job); 2 bad input (an override, the config, a checkpoint,
the data, the output folder); 3 the loss became NaN/inf; 4 the D-won alarm stopped the run (trainer.on_d_won=stop;
in a sweep the job returns no score and the sweep goes on); 128 + the signal's number when SIGINT, SIGTERM or
SLURM's USR1/USR2 stopped the run after it wrote its checkpoint; 5 under torchrun: another process of the job died."""

import logging
import math
import sys
from typing import TYPE_CHECKING, NoReturn, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from tqdm.contrib.logging import logging_redirect_tqdm

from gan import launch
from gan.config import validate
from gan.errors import UserError, environment_error
from gan.run import Run, held_log

if TYPE_CHECKING:  # job() imports torch and the trainer: --help and each TAB of shell completion need neither
    from gan.training import TrainResult
log = logging.getLogger("train")
EXIT_BAD_INPUT, EXIT_NON_FINITE, EXIT_D_WON, EXIT_PEER_LOST = 2, 3, 4, 5
SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143, "SIGUSR1": 138, "SIGUSR2": 140}


def main(argv: Optional[Sequence[str]] = None) -> int:
    return launch.run_hydra(job, "train", list(sys.argv[1:] if argv is None else argv))


def job(cfg: DictConfig) -> tuple[int, Optional[float]]:
    """(exit code, the final FID a sweeper minimises, or None: a failed trial, where a NaN would crash Optuna's)."""
    from gan import distributed
    from gan.training import NonFiniteLossError, loop

    world, sweep = distributed.world_from_env(), HydraConfig.get().mode == RunMode.MULTIRUN
    run = hydra_dir = Run(HydraConfig.get().runtime.output_dir)  # until resume_plan names the run's own folder
    distributed.init_process_group(world, cfg.trainer.device)
    if not world.is_main:  # rank 0 speaks for the job: every rank meets the same refusal, said once
        logging.getLogger().setLevel(logging.CRITICAL)
    with held_log() as run_log:  # the record and log file are written once every check has passed
        try:
            with logging_redirect_tqdm():  # log lines print above the progress bar, not through it
                cfg, folder = launch.resume_plan(cfg, hydra_dir.dir)
                run = Run(distributed.broadcast_object(str(folder), world))  # one run folder per job: rank 0's
                typed = validate(cfg)
                ready = (lambda: run.keep_record(cfg, run_log)) if world.is_main else None
                command, compared = launch.command("train", sweep)
                hparams = loop.hparams_of(typed, compared)
                result = loop.train(typed, run.dir, world=world, on_ready=ready, command=command, hparams=hparams)
                measure = world.is_main and not result.stopped_by and typed.trainer.final_eval_samples
                try:
                    fid = loop.final_evaluation(typed, result, run.dir) if measure else None
                except KeyboardInterrupt:  # Ctrl-C while measuring: the trained run is saved
                    log.warning("Interrupted (SIGINT) during the final evaluation. %s", loop.measure_later(run.dir))
                    if sweep:
                        raise SystemExit(SIGNAL_EXIT["SIGINT"]) from None
                    return SIGNAL_EXIT["SIGINT"], None
        except (UserError, NonFiniteLossError, OSError) as err:
            if isinstance(err, OSError):  # disk full, permissions: the environment, not a bug
                err = environment_error(err, then=loop.what_is_kept(run.dir))
            if sweep:  # Hydra records the failed job, and the sweep goes on
                raise launch.SweepJobFailed(str(err)) from err
            log.error("%s", err)
            return (EXIT_NON_FINITE if isinstance(err, NonFiniteLossError) else EXIT_BAD_INPUT), None
        except RuntimeError as err:  # a collective whose peer died (kill -9, out of memory): not this rank's bug
            if not (world.distributed and (reason := loop.peer_lost(err))):
                raise
            kept = loop.what_is_kept(run.dir).replace("run the command", "run the job", 1)
            log.error("Another process of this torchrun job ended, so this one stops too (%s); %s", reason, kept)
            return EXIT_PEER_LOST, None
        finally:
            distributed.close(world)
            hydra_dir.remove_if_empty()  # Hydra's folder, when the job was refused or resumed a run elsewhere
        return finish(result, fid, run, sweep)


def finish(result: "TrainResult", fid: Optional[float], run: Run, sweep: bool) -> tuple[int, Optional[float]]:
    """The run's last words (into its log) and exit code: stopped by the D-won alarm or a signal, or done."""
    if result.stopped_by == "d_won":
        log.warning("Stopped at step %d: D had won (trainer.on_d_won=stop). %s", result.step, result.outcome())
        return (0 if sweep else EXIT_D_WON), None  # a sweep goes on with its other jobs
    if result.stopped_by:
        facts = (result.stopped_by, result.step, result.checkpoint, launch.resume_command(run.dir))
        log.warning("Stopped by %s at step %d; checkpoint saved to %s. Resume with:\n  %s", *facts)
        if sweep:  # a signal stops the whole sweep, not just this job
            raise SystemExit(SIGNAL_EXIT[result.stopped_by])
        return SIGNAL_EXIT[result.stopped_by], None
    log.info("Done: %d steps; outputs in %s. %s", result.step, run.dir, result.outcome())
    return 0, fid if fid is not None and math.isfinite(fid) else None


def cli(program: str = "python train.py") -> NoReturn:
    launch.start("train", main, program)


if __name__ == "__main__":
    cli()
