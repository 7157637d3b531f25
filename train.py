"""Train a DCGAN: `python train.py [group=option] [key=value ...]`; see README.md and configs/.
Installed with pip, the same program is the command `dcgan-train` (gan/cli.py).

`main(argv)` runs the command line in this process and returns its exit code: the job turns Hydra's
config (a resume's: its checkpoint's, gan/runs.py) into a checked, typed one and calls train().
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from tqdm.contrib.logging import logging_redirect_tqdm

from gan import runs
from gan.checkpoint import load_checkpoint
from gan.config import register_configs, validate
from gan.distributed import broadcast_object, close, init_process_group, world_from_env
from gan.errors import UserError, environment_error
from gan.training import NonFiniteLossError, TrainResult, train
from gan.training.loop import final_evaluation, hparams_of

log = logging.getLogger("train")

# Exit codes: 0 done; 1 Hydra's own (a sweep with a failed job); 2 bad input (an override Hydra refuses,
# config, checkpoint, data, output folder); 3 the loss became NaN/inf; 4 the D-won alarm
# stopped the run (trainer.on_d_won=stop; a sweep's job returns no score instead and the sweep goes on);
# 128 + the signal's number when SIGINT/SIGTERM (or SLURM's time-out signal, USR2/USR1) stopped the
# run after it wrote its checkpoint, as shells report a process that signal ended. Under torchrun, 5: another
# process of the job died mid-step (gan/torchrun.py exits as the job's first failed process did).
EXIT_BAD_INPUT, EXIT_NON_FINITE, EXIT_D_WON, EXIT_PEER_LOST = 2, 3, 4, 5
SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143, "SIGUSR1": 138, "SIGUSR2": 140}
PROGRAM = "python train.py"  # how the Text tab's command line and the resume hint name this program


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python train.py ARGV`, in this process: the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    register_configs()
    problem = runs.preflight(argv)
    if world_from_env().distributed and runs.multirun(argv):
        problem = (
            "torchrun launches one training job over several processes; a Hydra sweep (-m) launches several "
            "jobs. Run the sweep without torchrun, or one torchrun per setting."
        )
    world = world_from_env()
    if problem:
        if world.is_main:  # under torchrun, rank 0 says it for every rank
            log.error("%s", problem)
        return EXIT_BAD_INPUT
    if world.is_main:
        return runs.run_hydra(job, "train", argv)
    said = io.StringIO()  # another rank: Hydra's own refusal (exit 1, no traceback) is rank 0's to say
    with contextlib.redirect_stderr(said):
        code = runs.run_hydra(job, "train", argv)
    if code != 1 or "Traceback" in said.getvalue():
        sys.stderr.write(said.getvalue())
    return code


def job(cfg: DictConfig) -> tuple[int, Optional[float]]:
    """One training job: (exit code, the final FID a sweeper minimises, or None when there is none: a
    sweeper records a job without a score as a failed trial, where a NaN would crash Optuna's)."""
    world = world_from_env()
    init_process_group(world, cfg.trainer.device)
    if not world.is_main:  # rank 0 speaks for the job: every rank meets the same refusal, said once
        logging.getLogger().setLevel(logging.CRITICAL)
    sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    hydra_dir = run_dir = Path(HydraConfig.get().runtime.output_dir)
    with runs.held_log() as run_log:  # the record and log file are written once every check has passed
        try:
            with logging_redirect_tqdm():  # log lines print above the progress bar, not through it
                cfg, run_dir = runs.resume_plan(cfg, hydra_dir)
                run_dir = Path(broadcast_object(str(run_dir), world))  # one run folder per job: rank 0's
                typed = validate(cfg)
                ready = (lambda: runs.keep_record(run_dir, cfg, run_log)) if world.is_main else None
                hparams = hparams_of(typed, compared(), context=not sweep)  # a sweep job: its swept keys alone
                result = train(typed, run_dir, world=world, on_ready=ready, command=command_line(), hparams=hparams)
                measure = world.is_main and not result.stopped_by and typed.trainer.final_eval_samples
                fid = final_evaluation(typed, result, run_dir) if measure else None
        except (UserError, NonFiniteLossError, OSError) as err:
            if isinstance(err, OSError):  # disk full, permissions: the environment, not a bug
                err = environment_error(err, then=what_is_kept(run_dir))
            if sweep:  # Hydra records the failed job, prints this paragraph and runs the others
                raise runs.SweepJobFailed(str(err)) from err
            log.error("%s", err)
            return (EXIT_NON_FINITE if isinstance(err, NonFiniteLossError) else EXIT_BAD_INPUT), None
        except RuntimeError as err:  # a collective whose peer died (kill -9, out of memory): not this rank's bug
            if not (world.distributed and peer_lost(err)):
                raise
            reason = re.sub(r"^\[[^\]]*\] ", "", str(err).strip().splitlines()[0]).split(". ")[0]  # gloo's source line
            log.error("Another process of this torchrun job ended, so this one stops too (%s); %s", reason,
                      what_is_kept(run_dir).replace("run the command", "run the job", 1))  # fmt: skip
            return EXIT_PEER_LOST, None
        finally:
            close(world)
            runs.remove_if_empty(hydra_dir)  # Hydra's folder, when the job was refused or resumed a run elsewhere
        return finish(result, fid, run_dir, sweep)


def peer_lost(err: RuntimeError) -> bool:
    """gloo and NCCL report a process that died mid-collective as a RuntimeError (DistError in newer torch)."""
    text = str(err)
    return isinstance(err, dist.DistError) or any(word in text for word in ("gloo", "NCCL", "by peer"))


def what_is_kept(run_dir: Path) -> str:
    """What to run after a failed write, by whether the run has a checkpoint to resume from."""
    last = run_dir / "checkpoints" / "last.pt"
    try:
        step = load_checkpoint(last)["step"]
    except UserError:
        return (
            f"run the command again. No checkpoint of this run was written ({last} does not exist), so the run "
            f"starts again from step 0: delete {run_dir} first if it holds this attempt's record (.hydra/)."
        )
    return (
        f"resume: python train.py {runs.resume_override(run_dir)} ({last} holds step {step}; checkpoints are "
        "written whole or not at all)."
    )


def command_line() -> str:
    """This job's command (a sweep job's own values), quoted for the shell: the Text tab shows it."""
    return " ".join([PROGRAM, *(runs.shell_quote(o) for o in HydraConfig.get().overrides.task)])


def compared() -> list[str]:
    """This job's overrides that its folder is named by (configs/train.yaml's exclude_keys, and in a sweep the
    keys given one value, gan/runs.py:SweepNames, left out): the settings its HParams columns compare."""
    excluded = set(HydraConfig.get().job.config.override_dirname.exclude_keys)
    return [o for o in HydraConfig.get().overrides.task if runs.override_key(o) not in excluded]


def finish(result: TrainResult, fid: Optional[float], run_dir: Path, sweep: bool) -> tuple[int, Optional[float]]:
    """The run's last words and exit code: stopped by the D-won alarm or a signal, or done."""
    if result.stopped_by == "d_won":
        log.warning("Stopped at step %d: D had won (trainer.on_d_won=stop). %s", result.step, result.outcome())
        return (0 if sweep else EXIT_D_WON), None  # a sweep goes on with its other jobs
    if result.stopped_by:
        log.warning(
            "Stopped by %s at step %d; checkpoint saved to %s. Resume with:\n  %s %s",
            *(result.stopped_by, result.step, result.checkpoint, PROGRAM, runs.resume_override(run_dir)),
        )
        if sweep:  # a signal stops the whole sweep, not just this job
            raise SystemExit(SIGNAL_EXIT[result.stopped_by])
        return SIGNAL_EXIT[result.stopped_by], None
    log.info("Done: %d steps; outputs in %s. %s", result.step, run_dir, result.outcome())
    return 0, fid if fid is not None and math.isfinite(fid) else None


def cli(program: str = PROGRAM) -> None:
    """The program: `python train.py`, or the command pip installs (`dcgan-train`, gan/cli.py)."""
    global PROGRAM
    PROGRAM = program
    logging.basicConfig(level=logging.INFO, format="[%(name)s][%(levelname)s] - %(message)s")  # until Hydra's
    sys.exit(main())


if __name__ == "__main__":
    cli()
