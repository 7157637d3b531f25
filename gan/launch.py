"""The programs as Hydra apps (Hydra's flags; a refusal is one paragraph, exit 2), their checks, the resume contract.
No torch at import: --help, --cfg and each TAB of shell completion load Hydra and this alone (torch takes seconds)."""

from __future__ import annotations

import difflib
import functools
import logging
import os
import re
import shlex
import sqlite3
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn, Optional, Sequence

import hydra
import yaml
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import CompactHydraException, HydraException, MissingConfigException, OverrideParseException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, read_write
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from gan.config import EvaluateConfig, GenerateConfig, TrainConfig, to_plain
from gan.errors import ConfigError, UserError
from gan.run import Run
from gan.world import world_from_env

log = logging.getLogger(__name__)
# configs/ of a clone, or gan/configs/ where pip installed the package (pyproject.toml maps one to the other)
CONFIG_DIR = next(d for d in (Path(__file__).parent / "configs", Path(__file__).parents[1] / "configs") if d.is_dir())
SCHEMAS = {"train": TrainConfig, "evaluate": EvaluateConfig, "generate": GenerateConfig}
EXIT_HYDRA, EXIT_BAD_INPUT = 1, 2  # 1: Hydra's own (a sweep with a failed job); 2: bad input
# What a resume may change: where and how the run executes and what it measures (resume=auto ignores these) ...
RUNTIME_KEYS = {
    "data": "root download in_memory num_workers".split(),
    "trainer": "max_steps resume device progress threads adapt_threads retain_host_memory log_every sample_every "
    "checkpoint_every keep_checkpoints final_eval_samples eval_every eval_samples overfit_every on_d_won "
    "d_won_window".split(),
}
# ... and what an explicit resume may tune, part of the identity resume=auto matches (no sweep point continues another)
RESUMABLE = {**RUNTIME_KEYS, "optim": ["lr", "lr_d", "lr_decay"]}
RESUMABLE["trainer"] = RUNTIME_KEYS["trainer"] + "precision compile channels_last on_nan deterministic".split()
# Refused by their old name with the new one: the alarm detects D winning outright, which is not mode collapse
RENAMED = {"trainer.on_collapse": "trainer.on_d_won", "trainer.collapse_window": "trainer.d_won_window"}
# Settings that name a file or folder: a path may hold what Hydra's grammar reserves ('=', ' ', ',')
PATH_KEYS = ("trainer.resume", "hydra.run.dir", "hydra.sweep.dir", "data.root", "checkpoint", "out")
RERUN = "--experimental-rerun"  # Hydra's flag that unpickles a config.pickle
PROGRAMS = {"train": "python train.py", "evaluate": "python evaluate.py", "generate": "python generate.py"}


class SweepJobFailed(CompactHydraException):
    """A sweep job refused its input: Hydra records the failed job and goes on with the others."""


def run_hydra(job: Callable[[DictConfig], tuple[int, Optional[float]]], config_name: str, argv: Sequence[str]) -> int:
    if any(len(flag := arg.split("=")[0]) > 2 and RERUN.startswith(flag) for arg in argv):  # argparse takes --exp
        log.error("%s unpickles a file: it runs any code it names. Nothing was read or written. Drop the flag.", RERUN)
        return EXIT_BAD_INPUT
    codes: list[int] = []

    @hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=config_name)
    def task(cfg: DictConfig) -> Optional[float]:
        codes.append((done := job(cfg))[0])
        return done[1]

    saved_argv, saved_env = sys.argv, os.environ.get("HYDRA_FULL_ERROR")
    own_traceback = saved_env == "1"  # the user asked for Hydra's traceback: let it be
    # sys.argv[0] is how Hydra's shell completion names the program: `python` for a .py file, else the command
    sys.argv = [f"{config_name}.py" if PROGRAMS[config_name].startswith("python ") else PROGRAMS[config_name], *argv]
    os.environ["HYDRA_FULL_ERROR"] = "1"
    GlobalHydra.instance().clear()
    try:
        task()
    except SystemExit as stop:  # Hydra's own (--help, -sc), or a callback's refusal
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else EXIT_HYDRA)
    except SweepJobFailed as err:  # the jobs ran; Hydra said which one failed
        log.error("%s", err)
        return EXIT_HYDRA
    except (HydraException, OmegaConfBaseException, UserError, OSError, ValueError) as err:
        frames = [frame for frame, _ in traceback.walk_tb(err.__traceback__)]
        raiser = frames[-1].f_globals.get("__name__", "") + "." if frames else ""  # the module that raised it
        no_best = re.search("Record does not exist|No trials are completed", str(err))  # optuna: none scored
        if not own_traceback and raiser.startswith("optuna.") and no_best:
            why = "No trial of the search returned a score (each run's log in hydra.sweep.dir says why), so it has no "
            log.error("%s", why + "best trial. Set trainer.final_eval_samples above 0, then search again.")
            return EXIT_HYDRA
        if own_traceback or (type(err) is ValueError and not raiser.startswith("hydra.")):  # ours: a bug
            raise
        if isinstance(err, OSError) and not isinstance(err, HydraException):  # Hydra could not make the folder
            key = "out" if config_name == "generate" else "hydra.run.dir"  # generate.py's folder is `out`
            key = "hydra.sweep.dir" if {"-m", "--multirun"} & set(argv) else key
            err = UserError(unwritable(key, Path(os.fsdecode(err.filename or ".")), err))
        if world_from_env().is_main:  # under torchrun, rank 0 says it for every rank
            log.error("%s", err if isinstance(err, UserError) else hydra_refusal(err, config_name))
        return EXIT_BAD_INPUT
    finally:
        sys.argv = saved_argv
        os.environ.pop("HYDRA_FULL_ERROR") if saved_env is None else os.environ.update(HYDRA_FULL_ERROR=saved_env)
    return max(codes, default=0)


def start(name: str, main: Callable[[], int], program: str) -> NoReturn:
    PROGRAMS[name] = program
    logging.basicConfig(level=logging.INFO, format="[%(name)s][%(levelname)s] - %(message)s")
    sys.exit(main())


def hydra_refusal(err: Exception, config_name: str) -> str:  # one paragraph naming the override and what to do
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    key, hint = getattr(cause, "full_key", None), ""
    lines = [line.strip() for line in f"{err}\n{cause if cause is not err else ''}".splitlines()]
    noise = ("full_key:", "reference_type=", "object_type=", "See https://", "To append", "^")
    said = " ".join(line for line in lines if line and not line.startswith(noise)).split(" Config search path")[0]
    said = f"{key}: {said}" if key and str(key) not in said else said
    if isinstance(err, OverrideParseException):
        name, _, value = err.override.partition("=")
        detail = said.replace(f"Error parsing override '{err.override}'", "").replace(err.override, "").strip(" :")
        said = f"Hydra's override grammar cannot read {err.override!r} ({detail}): quote a value holding symbols"
        if name.lstrip("+~") in PATH_KEYS:  # a path holding '=', ',' or spaces: Hydra says "mismatched input"
            said = f"{err.override}: Hydra's override grammar cannot read this path as written"
            hint = f"Quote it for Hydra inside the shell's quotes: {shell_quote(f'{name}={hydra_quote(value)}')} "
    elif isinstance(err, MissingConfigException) and err.options:
        group = str(err.missing_cfg_file).rsplit("/", 1)[0]
        said, hint = said.split(" Available options")[0], f"Choose one of {', '.join(err.options)} for {group}=. "
        if group.startswith("hydra/"):  # hparams_search=optuna and hydra/launcher=slurm name a plugin's config
            hint += "The others come with Hydra plugins: pip install -c constraints.txt -e '.[sweeps]' or '.[slurm]'. "
    elif key and str(key) in RENAMED:
        hint = f"{key} was renamed {RENAMED[str(key)]}: use that. "
    elif key and isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and config_name in SCHEMAS:
        parent, _, name = str(key).rpartition(".")
        node = OmegaConf.select(OmegaConf.structured(SCHEMAS[config_name]), parent)
        near = difflib.get_close_matches(name, list(node) if isinstance(node, DictConfig) else [], n=1)
        hint = f"Did you mean {parent + '.' if parent else ''}{near[0]}? " if near else ""
    return f"{said.rstrip('.')}. Nothing was written. {hint}--cfg job prints every setting, --help the groups."


def command(program: str, sweep: bool) -> tuple[str, list[str]]:
    """This job's command line, quoted for the shell, and a sweep job's overrides naming its folder (for HParams)."""
    hydra_cfg = HydraConfig.get()
    excluded = set(hydra_cfg.job.config.override_dirname.exclude_keys)
    compared = [o for o in hydra_cfg.overrides.task if override_key(o) not in excluded] if sweep else []
    return " ".join([PROGRAMS[program], *map(shell_quote, hydra_cfg.overrides.task)]), compared


def data_overrides(cfg: DictConfig, overrides: Sequence[str]) -> dict[str, Any]:
    """evaluate.py: the data.* keys among its overrides, as Hydra typed them (they replace the checkpoint's)."""
    keys = [key for key in map(override_key, overrides) if key.startswith("data.")]
    return {key.removeprefix("data."): OmegaConf.select(cfg, key) for key in keys}


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


class LaunchChecks(Callback):
    """What only the launch can check, before Hydra makes a folder (Hydra would warn of a callback's exception)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if (folder := OmegaConf.select(config, "hydra.run.dir", throw_on_resolution_failure=False)) is not None:
            empty_path("hydra.run.dir", folder)  # (one that cannot be resolved: Hydra refuses it next)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        folder = empty_path("hydra.sweep.dir", config.hydra.sweep.dir)
        if world_from_env().distributed:
            refuse("A Hydra sweep (-m) launches several jobs, torchrun one: run the sweep without torchrun.")
        if (folder / "multirun.yaml").is_file() and OmegaConf.select(config, "trainer.resume") != "auto":
            again = "Add trainer.resume=auto to continue it, or choose" if "trainer" in config else "Choose"
            refuse(f"hydra.sweep.dir={folder} holds a sweep (multirun.yaml). Nothing was written. {again} another.")
        sweeper = config.hydra.sweeper  # with n_trials: hparams_search=optuna, what its sweeper does not check
        if problem := values_problem(config) or ("n_trials" in sweeper and search_problem(sweeper, folder)):
            refuse(f"{problem}. Nothing was written.")
        try:  # made now: an Optuna study's file is kept there
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            refuse(unwritable("hydra.sweep.dir", folder, err))


def values_problem(config: DictConfig) -> str:  # the first swept value Hydra cannot compose a job of, or ''
    searched = [f"{k}={v}" for k, v in (OmegaConf.select(config, "hydra.sweeper.params") or {}).items()]
    loader = GlobalHydra.instance().config_loader()
    parsed = OverridesParser.create(config_loader=loader).parse_overrides([*searched, *config.hydra.overrides.task])
    sweeps = [o for o in parsed if o.is_sweep_override()]  # each choice, or an interval's two ends
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    swept = {o.get_key_element(): list(o.sweep_string_iterator()) for o in sweeps if not o.is_interval_sweep()}
    swept |= {o.get_key_element(): [str(o.value().start), str(o.value().end)] for o in sweeps if o.is_interval_sweep()}
    for i in range(max(map(len, swept.values()), default=0)):  # each value of each key at least once
        job = [f"{key}={values[i % len(values)]}" for key, values in swept.items()]
        try:
            loader.load_sweep_config(config, [*fixed, *job])
        except (HydraException, OmegaConfBaseException) as err:
            said = hydra_refusal(err, config.hydra.job.config_name).split(" Nothing was written.")[0]
            where = "hydra.sweeper.params" if searched else "the swept values"
            return f"The sweep cannot compose a job of {' '.join(job)}: {said} Change {where}"
    return ""


def search_problem(sweeper: DictConfig, sweep: Path) -> str:
    for key, what in (("n_trials", "trials to run"), ("n_jobs", "trials asked for at once")):
        if not sweeper[key] or sweeper[key] < 1:
            return f"hydra.sweeper.{key}={sweeper[key]}: the number of {what} must be 1 or more"
    if not 0 <= sweeper.max_failure_rate <= 1:
        return f"hydra.sweeper.max_failure_rate={sweeper.max_failure_rate} must be from 0 to 1 (a share of trials)"
    if not sweeper.study_name and sweeper.storage:
        return f"hydra.sweeper.study_name={sweeper.study_name}: a stored study needs a name to be continued: give one"
    if sweeper.direction != "minimize":
        return f"hydra.sweeper.direction={sweeper.direction}: a trial returns its FID (lower is better): leave it out"
    if (storage := sweeper.storage) is None or not str(storage).startswith("sqlite:///"):
        log.warning("The study is kept %s, not in the sweep folder %s.", storage or "in memory", sweep)
        return ""
    file, said = Path(str(storage).removeprefix("sqlite:///")).expanduser(), f"hydra.sweeper.storage={storage}"
    if not (inside := file.resolve().parent == sweep.resolve()):
        log.warning("The study is stored in %s, outside the sweep folder %s.", file, sweep)
    if file.is_dir():
        return f"{said} names a folder, where the study is kept in a file: name a file"
    if not file.parent.is_dir():  # the sweep folder is made next, with the sweep's own checks
        return "" if inside else f"{said}: the folder {file.parent} does not exist: make it"
    if not os.access(target := file if file.exists() else file.parent, os.W_OK):
        return f"{said}: this user cannot write {target}: give write permission there"
    try:
        if file.exists():  # (a new one: optuna makes it)
            sqlite3.connect(f"file:{file}?mode=ro", uri=True).execute("PRAGMA quick_check").fetchall()
    except sqlite3.Error as err:
        return f"{said}: {file} cannot be read as an SQLite database ({err}): move it away, or choose another"
    return ""


def unwritable(key: str, folder: Path, err: OSError) -> str:
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), folder)
    why = f"{blocker} is not a directory" if blocker.exists() and not blocker.is_dir() else err.strerror or err
    return f"Cannot write the run directory {folder}: {why}. Nothing was written. Choose a writable {key}=PATH."


def empty_path(key: str, value: str) -> Path:
    if not str(value).strip():  # an unset shell variable: Path("") is the launch directory
        refuse(f"{key}={value} is empty (an unset shell variable?). Nothing was written. Give {key} a path.")
    return Path(value).expanduser()


def refuse(message: str) -> NoReturn:
    if world_from_env().is_main:  # under torchrun, rank 0 says it for every rank
        log.error("%s", message)
    raise SystemExit(EXIT_BAD_INPUT)


class SweepNames(Callback):
    """Names a sweep's jobs by the overrides that vary (`0_optim.lr=0.0001`), unless exclude_keys are given by hand."""

    EXCLUDE_KEYS = "hydra.job.config.override_dirname.exclude_keys"

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        hydra_overrides = config.hydra.overrides.hydra
        parsed = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
        constant = [o.key_or_group for o in parsed if not o.is_sweep_override()]
        if constant and not any(override_key(o) == self.EXCLUDE_KEYS for o in hydra_overrides):
            keys = list(dict.fromkeys([*config.hydra.job.config.override_dirname.exclude_keys, *constant]))
            with read_write(hydra_overrides):
                hydra_overrides.append(f"{self.EXCLUDE_KEYS}=[{','.join(repr(key) for key in keys)}]")


def resume_plan(cfg: DictConfig, output_dir: Path) -> tuple[DictConfig, Path]:
    """The checkpoint's config with this command's settings over it, in its run's folder unless the command says."""
    from gan.checkpoint import checkpoint_path, load_checkpoint, stored_config  # torch: a job's import

    resume, hydra_cfg = cfg.trainer.resume, HydraConfig.get()
    if resume == "auto":
        found = resume_auto(to_plain(cfg), output_dir)
        log.info("trainer.resume=auto: %s", f"continuing {found}" if found else "no matching run, starting one")
        resume = str(found) if found else None
        with read_write(cfg):
            cfg.trainer.resume = resume
    if resume is None:
        return cfg, output_dir
    checkpoint, file = load_checkpoint(resume), checkpoint_path(resume)  # refuses an empty path, a damaged file
    placed = hydra_cfg.mode == RunMode.MULTIRUN or "hydra.run.dir" in map(override_key, hydra_cfg.overrides.hydra)
    if (own := Run.of_checkpoint(file)) is not None and not placed:
        output_dir = own.dir  # train() takes its lock: a second resume of a run in use is refused
    stored, defaults = stored_config(checkpoint["config"], file), to_plain(OmegaConf.structured(TrainConfig))
    named = {override_key(o) for o in hydra_cfg.overrides.task}
    for group, values in to_plain(cfg).items():  # named (a group: all of it) or off the defaults (configs/train.yaml)
        for key, value in values.items() if isinstance(values, dict) else ():
            if {group, f"{group}.{key}"} & named or defaults.get(group, {}).get(key) != value:
                stored[group][key] = value  # trainer.resume among them: it is not null
    return OmegaConf.merge(OmegaConf.structured(TrainConfig), stored), output_dir


def resume_auto(config: dict, output_dir: Path, outputs: Path = Path("outputs")) -> Optional[Path]:
    """This job's own checkpoint, else the newest under `outputs` whose run recorded these settings."""
    if (own := Run(output_dir)).last.is_file():
        return own.last
    for last in sorted(outputs.glob(f"**/{Run.LAST}"), key=os.path.getmtime, reverse=True):
        record = Run.of_checkpoint(last).record / "config.yaml"
        try:  # a scalar group: run_identity would leave it out and match on the others alone
            recorded = to_plain(OmegaConf.load(record))
            why = next((f"its group {g!r} is {v!r}" for g, v in recorded.items() if type(v) is not dict), None)
        except FileNotFoundError:  # a run that wrote no record is no one's to continue by its settings
            continue
        except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException, AttributeError) as err:  # not UTF-8
            why = err
        if why:
            log.warning("trainer.resume=auto: %s cannot be read (%s), so that run is not continued.", record, why)
        elif run_identity(recorded, RUNTIME_KEYS) == run_identity(config, RUNTIME_KEYS):
            return last
    return None


def check_resume(cfg: dict, checkpoint: Mapping[str, Any], source: str) -> None:
    """The resume contract: ConfigError naming each change outside RESUMABLE, or a max_steps below the step."""
    from gan.checkpoint import stored_config

    before, after = run_identity(stored_config(checkpoint["config"], source), RESUMABLE), run_identity(cfg, RESUMABLE)
    if changed := sorted(k for k in before | after if before.get(k) != after.get(k)):
        said = "; ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in changed)
        may = ", ".join(f"{group}.{key}" for group, keys in RESUMABLE.items() for key in keys if key != "resume")
        why = f"changes what the run computes ({said}). Nothing was written. A resume may change only {may}"
        raise ConfigError(f"trainer.resume={source} {why}: drop the others, or drop trainer.resume to start a new run.")
    step, max_steps = int(checkpoint["step"]), cfg["trainer"]["max_steps"]
    if max_steps < step:
        why = f"is below the step of the checkpoint being resumed ({step}). Nothing was written. Pass trainer.max_steps"
        raise ConfigError(f"trainer.max_steps={max_steps} {why} above {step} to train further.")
    if max_steps == step:
        log.info("The checkpoint is at step %d = trainer.max_steps: nothing left to train.", step)


def run_identity(config: dict, ignored: Mapping[str, Sequence[str]]) -> dict:
    """What makes two runs the same run: each setting by its dotted name, but hydra's section and the `ignored` keys."""
    groups = {g: values for g, values in config.items() if g != "hydra" and isinstance(values, dict)}
    return {f"{g}.{k}": v for g, values in groups.items() for k, v in values.items() if k not in ignored.get(g, ())}


def hydra_quote(path: Path | str) -> str:
    """A path as one Hydra value: quoted where needed (backslashes doubled only before a quote or the end)."""
    text = str(path)
    quoted = "'" + re.sub(r"(\\*)('|\Z)", lambda m: m[1] * 2 + ("\\'" if m[2] else ""), text) + "'"
    return quoted if any(c in text for c in " =,[]{}()'\"\\:$") else text


def shell_quote(text: str) -> str:
    """`text` as one word of a POSIX shell, in double quotes where nothing in it is special there."""
    return shlex.quote(text) if text == shlex.quote(text) or any(c in text for c in '"$`\\!') else f'"{text}"'


def resume_command(run_dir: Path, program: str = "train", key: str = "trainer.resume") -> str:
    return f"{PROGRAMS[program]} {shell_quote(f'{key}={hydra_quote(run_dir)}')}"


measure_command = functools.partial(resume_command, program="evaluate", key="checkpoint")


if not OmegaConf.has_resolver("program"):  # configs/*.yaml: --help names the program as it was invoked
    OmegaConf.register_new_resolver("program", lambda name: PROGRAMS[name])
