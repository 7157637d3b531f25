"""A run's life on disk, for both entry points: Hydra run in this process (`run_hydra`), the checks
before Hydra starts, one owner per run folder, the record written once every check has passed, and
the resume: the checkpoint's config is the source of truth, the command's settings are laid over it,
and train() refuses those a resume may not change (`RESUMABLE`)."""

import contextlib
import difflib
import errno
import fcntl
import logging
import os
import shlex
import socket
import sys
import tempfile
from logging.handlers import MemoryHandler
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import hydra
import yaml
from hydra import compose
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import CompactHydraException, HydraException, MissingConfigException, OverrideParseException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, read_write
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from gan.checkpoint import checkpoint_path, load_checkpoint, stored_config
from gan.config import TrainConfig
from gan.errors import ConfigError, RunDirError

log = logging.getLogger(__name__)
# configs/ of a clone, or gan/configs/ where pip installed the package (pyproject.toml maps one to the other)
CONFIG_DIR = next(d for d in (Path(__file__).parent / "configs", Path(__file__).parents[1] / "configs") if d.is_dir())

# The resume contract: what a resume may change. Where and how the run executes, and what it
# measures (trainer.resume=auto ignores these when it looks for the run to continue) ...
RUNTIME_KEYS: dict[str, tuple[str, ...]] = {
    "data": ("root", "download", "in_memory", "num_workers"),
    "trainer": tuple(
        "max_steps resume device progress threads retain_host_memory log_every sample_every checkpoint_every "
        "keep_checkpoints final_eval_samples eval_every eval_samples overfit_every on_d_won d_won_window".split()
    ),
}
# ... and the arithmetic an explicit resume may tune (a lower rate, other hardware), which
# trainer.resume=auto treats as the run's identity: a sweep over rates never continues another point.
TUNABLE_ON_RESUME: dict[str, tuple[str, ...]] = {
    "optim": ("lr", "lr_d", "lr_decay"),
    "trainer": ("precision", "compile", "channels_last", "on_nan", "deterministic"),
}
RESUMABLE = {
    group: (*RUNTIME_KEYS.get(group, ()), *TUNABLE_ON_RESUME.get(group, ())) for group in ("data", "optim", "trainer")
}


class SweepJobFailed(CompactHydraException):
    """A sweep job refused its input: Hydra prints the message without a traceback and goes on."""


# Running Hydra in process -------------------------------------------------------------------------


def run_hydra(job: Callable[[DictConfig], tuple[int, Optional[float]]], config_name: str, argv: Sequence[str]) -> int:
    """`job` under @hydra.main with `argv` as the command line, in this process: the exit code, the
    job's (it returns (code, value a sweeper minimises)) or Hydra's own (1: a failed
    sweep job). Nothing calls sys.exit, so tests drive the real command line in process."""
    codes: list[int] = []

    @hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=config_name)
    def task(cfg: DictConfig) -> Optional[float]:
        code, value = job(cfg)
        codes.append(code)
        return value

    saved = sys.argv
    sys.argv = [f"{config_name}.py", *argv]
    GlobalHydra.instance().clear()
    try:
        task()
    except SystemExit as stop:  # Hydra's own: --help, a bad override, a failed sweep job
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv = saved
        GlobalHydra.instance().clear()
    return max(codes, default=0)


def multirun(argv: Sequence[str]) -> bool:
    return "-m" in argv or "--multirun" in argv


def override_key(override: str) -> str:
    """'+a.b=1' -> 'a.b'; 'loss=hinge' -> 'loss'."""
    return override.split("=", 1)[0].lstrip("+~")


def given_value(argv: Sequence[str], key: str) -> Optional[str]:
    """The last value the command line gives `key`, as Hydra reads it (quotes removed), or None."""
    values = [a.split("=", 1)[1] for a in argv if "=" in a and override_key(a) == key]
    return unquote(values[-1]) if values else None


# Before Hydra starts: what Hydra would report with a traceback, or do before the job can refuse ---

# Settings that name a file or folder: a path may hold what Hydra's grammar reserves ('=', ' ', ',')
PATH_KEYS = ("trainer.resume", "hydra.run.dir", "hydra.sweep.dir", "data.root", "checkpoint")
# Renamed settings, refused by their old name with the new one (Hydra alone would say "not in TrainerConfig").
# The alarm detects D winning outright, which is not mode collapse: mode collapse has no loss signature.
RENAMED = {"trainer.on_collapse": "trainer.on_d_won", "trainer.collapse_window": "trainer.d_won_window"}


def preflight(argv: Sequence[str], resumable: bool = True, config_name: str = "train") -> Optional[str]:
    """The refusal of what Hydra would handle badly before any job runs, or None."""
    return (
        renamed_setting(argv)
        or empty_path(argv)
        or unreadable_path(argv)
        or unusable_override(argv, config_name)
        or unwritable_output(argv)
        or existing_sweep(argv, resumable)
    )


# Hydra's options that choose another config: the command line is then composed as they say, by Hydra alone
CONFIG_FLAGS = ("--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd")


def unusable_override(argv: Sequence[str], config_name: str) -> Optional[str]:
    """Hydra's refusal of an override (a wrong type, an unknown key or option, a value its grammar cannot read) in
    one paragraph, where Hydra would print several and exit 1. A sweep's jobs are composed one value at a time."""
    if any(arg.split("=", 1)[0] in CONFIG_FLAGS for arg in argv):
        return None
    overrides = [arg for arg in argv if not arg.startswith("-")]
    try:
        jobs = [overrides]
        if multirun(argv):
            parsed = OverridesParser.create().parse_overrides(overrides)
            fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
            # each value of a list, range or choice as written (with its + or ~); interval(...) is Optuna's to read
            swept = [(o.input_line.split("=", 1)[0], o) for o in parsed if o.is_discrete_sweep()]
            jobs = [[*fixed, f"{key}={value}"] for key, o in swept for value in o.sweep_string_iterator()] or [fixed]
        for job in jobs:
            GlobalHydra.instance().clear()
            with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
                cfg = compose(config_name=config_name, overrides=job)
            OmegaConf.to_container(cfg, resolve=True)  # an interpolation of a key there is no such as ${nosuch}
    except (HydraException, OmegaConfBaseException) as err:
        return hydra_refusal(err, config_name)
    finally:
        GlobalHydra.instance().clear()
    return None


def hydra_refusal(err: Exception, config_name: str) -> str:
    """Hydra's or OmegaConf's error about a command line as one paragraph naming the override and what to do
    (whether the program is `python train.py` or the wheel's `dcgan-train`)."""
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    key, hint = getattr(cause, "full_key", None), ""
    lines = [line.strip() for line in f"{err}\n{cause if cause is not err else ''}".splitlines()]
    noise = ("full_key:", "reference_type=", "object_type=", "See https://", "To append", "^")
    said = " ".join(line for line in lines if line and not line.startswith(noise)).split(" Config search path")[0]
    if key and str(key) not in said:
        said = f"{key}: {said}"
    if isinstance(err, OverrideParseException):
        detail = said.replace(f"Error parsing override '{err.override}'", "").replace(err.override, "").strip(" :")
        said = f"Hydra's override grammar cannot read {err.override!r} ({detail}): quote a value holding symbols"
    elif isinstance(err, MissingConfigException) and err.options:
        group = str(err.missing_cfg_file).rsplit("/", 1)[0]
        said, hint = said.split(" Available options")[0], f"Choose one of {', '.join(err.options)} for {group}=. "
        if group.startswith("hydra/"):  # hparams_search=optuna and hydra/launcher=slurm name a plugin's config
            hint += "The others come with Hydra plugins: pip install -c constraints.txt -e '.[sweeps]' or '.[slurm]'. "
    elif key and isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        parent, _, name = str(key).rpartition(".")
        GlobalHydra.instance().clear()
        with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            node = OmegaConf.select(compose(config_name=config_name), parent) if parent else None
        near = difflib.get_close_matches(name, list(node) if isinstance(node, DictConfig) else [], n=1)
        hint = f"Did you mean {parent}.{near[0]}? " if near else ""
    return (
        f"{said.rstrip('.')}. Nothing was written. {hint}The command with --cfg job prints every setting and its "
        "value, with --help the groups and their options; an override reads key=value."
    )


def renamed_setting(argv: Sequence[str]) -> Optional[str]:
    for arg in argv:
        if (key := override_key(arg)) in RENAMED:
            value = arg.split("=", 1)[1] if "=" in arg else "..."
            return (
                f"{key} was renamed {RENAMED[key]}: the alarm it sets detects D winning outright (train/d_won), "
                f"which is not mode collapse. Nothing was written. Use {RENAMED[key]}={value}"
            )
    return None


def empty_path(argv: Sequence[str]) -> Optional[str]:
    """A path setting given as nothing (an unset shell variable): Path("") is the launch directory."""
    for key in PATH_KEYS:
        if (value := given_value(argv, key)) is not None and not value.strip():
            return (
                f"{key}={value} is empty (an unset shell variable?), which names the launch directory. Nothing was "
                f"written. Give {key} a path, or leave it out."
            )
    return None


def unreadable_path(argv: Sequence[str]) -> Optional[str]:
    """A path setting Hydra would report as "mismatched input '='" without naming the setting."""
    parser = OverridesParser.create()
    for arg in argv:
        key = override_key(arg)
        if key not in PATH_KEYS or "=" not in arg:
            continue
        try:
            parser.parse_override(arg)
        except HydraException:
            value = arg.split("=", 1)[1]
            return (
                f"{key}={value}: Hydra cannot read this path as written: it holds characters its override "
                f"grammar reserves ('=', ',', spaces, brackets or quotes). Nothing was written. Quote it for "
                f"Hydra inside the shell's quotes: {shell_quote(f'{key}={hydra_quote(unquote(value))}')}"
            )
    return None


def unwritable_output(argv: Sequence[str]) -> Optional[str]:
    """Tried, not guessed from permission bits (wrong for root on a read-only file system, or a spent
    quota): a folder and one block of data are written in the nearest existing folder, and removed."""
    key = "hydra.sweep.dir" if multirun(argv) else "hydra.run.dir"
    target = Path(given_value(argv, key) or "outputs")
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        why = f"{existing} is not a directory"
    elif err := write_probe(existing):
        why = f"{err.strerror or err} (the nearest existing folder is {existing})"
    else:
        return None
    return (
        f"Cannot write the run directory {target}: {why}. Choose a writable folder "
        f"with {key}=PATH (or launch from a writable directory)."
    )


def write_probe(folder: Path) -> Optional[OSError]:
    """Why `folder` refuses a new file holding one block of data (a full disk refuses the blocks, not the
    name), or None; the file is removed."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-") as file:
            file.write(bytes(4096))
            file.flush()
            os.fsync(file.fileno())
    except OSError as err:
        return err
    return None


def existing_sweep(argv: Sequence[str], resumable: bool = True) -> Optional[str]:
    """A sweep into a hydra.sweep.dir holding one (Hydra would replace its multirun.yaml), unless it is
    launched again to continue its jobs (trainer.resume=auto)."""
    folder = given_value(argv, "hydra.sweep.dir")
    if not multirun(argv) or folder is None or (resumable and given_value(argv, "trainer.resume") == "auto"):
        return None
    if not (Path(folder).expanduser() / "multirun.yaml").is_file():
        return None
    again = "Add trainer.resume=auto to continue each job's run there, or choose" if resumable else "Choose"
    return (
        f"hydra.sweep.dir={folder} already holds a sweep (multirun.yaml): Hydra would replace its record, and "
        f"its jobs' folders hold its results. Nothing was written. {again} another hydra.sweep.dir for a new sweep."
    )


# Sweep folders named by what varies -----------------------------------------------------------------

# Hydra's list of override keys left out of a job's override_dirname (configs/train.yaml sets it)
EXCLUDE_KEYS = "hydra.job.config.override_dirname.exclude_keys"


class SweepNames(Callback):
    """Names each sweep job by the overrides that vary (`0_optim.lr=0.0001`, not
    `0_optim.lr=0.0001,trainer.threads=1`, which TensorBoard's run list cuts): as the sweep starts,
    the keys given one value join override_dirname's exclude_keys as an override of Hydra's, which
    every job's config (and submitit's) is rebuilt with. An exclude_keys given by hand wins."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        hydra_overrides = config.hydra.overrides.hydra
        if any(override_key(o) == EXCLUDE_KEYS for o in hydra_overrides):
            return
        parsed = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
        constant = [o.key_or_group for o in parsed if not o.is_sweep_override()]
        if constant:
            keys = list(dict.fromkeys([*config.hydra.job.config.override_dirname.exclude_keys, *constant]))
            with read_write(hydra_overrides):
                hydra_overrides.append(f"{EXCLUDE_KEYS}=[{','.join(repr(key) for key in keys)}]")


class SweepFolder(Callback):
    """Makes hydra.sweep.dir as the sweep starts: an Optuna study stored there (hparams_search=optuna)
    opens its SQLite file before the launcher makes the folder for the first job."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        Path(config.hydra.sweep.dir).mkdir(parents=True, exist_ok=True)


# The resume: the checkpoint's config, and this command's resumable settings over it -----------------


def resume_plan(cfg: DictConfig, output_dir: Path) -> tuple[DictConfig, Path]:
    """This job's config and run folder: the command's, in Hydra's folder; for a resume, the config
    stored in the checkpoint with this command's settings laid over it, in the checkpoint's run folder
    unless the command names one (hydra.run.dir, a sweep's job folder). `auto` continues this job's
    own run, else the newest under outputs/ with these settings (RUNTIME_KEYS aside), else starts."""
    resume = cfg.trainer.resume
    if resume in (None, ""):
        return cfg, output_dir
    named = {override_key(o) for o in HydraConfig.get().overrides.hydra}
    placed = HydraConfig.get().mode == RunMode.MULTIRUN or "hydra.run.dir" in named
    if resume == "auto":
        found = resume_auto(to_dict(cfg), output_dir)
        log.info("trainer.resume=auto: %s", f"continuing {found}" if found else "no matching run, starting one")
        if found is None:
            with read_write(cfg):
                cfg.trainer.resume = None
            return cfg, output_dir
        resume = str(found)
    file = checkpoint_path(resume)
    if file.parent.name == "checkpoints" and not placed:
        output_dir = file.parent.parent  # train() takes its lock: a second resume of a run in use is refused
    stored = stored_config(load_checkpoint(file)["config"], file)
    if problem := record_disagreement(file, stored):
        raise RunDirError(problem)
    wanted = to_dict(cfg)
    for group, key in given_settings(wanted):
        stored[group][key] = wanted[group][key]
    stored["trainer"]["resume"] = resume
    return OmegaConf.merge(OmegaConf.structured(TrainConfig), stored), output_dir


def record_disagreement(file: Path, stored: dict) -> Optional[str]:
    """What the .hydra/ record beside a run's checkpoint says that the checkpoint does not, in one paragraph, or
    None: config.yaml is compared whole, overrides.yaml setting by setting (a resume's record names only its own
    settings), each outside RESUMABLE; a key the checkpoint lacks is named too."""
    record = file.parent.parent / RECORD
    if file.parent.name != "checkpoints" or not record.is_dir():
        return None
    problems = []
    for name in ("config.yaml", "overrides.yaml"):
        if not (record / name).is_file():
            continue
        try:
            recorded, keys = to_dict(OmegaConf.load(record / name)), None
            if name == "overrides.yaml":
                overrides = [str(o) for o in recorded]
                job = HydraConfig.get().job.config_name
                recorded = to_dict(compose(config_name=job, overrides=overrides))
                keys = set(named_keys(overrides, recorded, to_dict(compose(config_name=job))))
            if not isinstance(recorded, dict):
                raise TypeError(f"it holds {type(recorded).__name__}, not a mapping of groups")
            problems += differences(name, recorded, stored, keys)
        except (OSError, yaml.YAMLError, OmegaConfBaseException, HydraException, TypeError) as err:
            problems.append(f"{name} cannot be read as settings ({str(err).strip().splitlines()[0]})")
    if not problems:
        return None
    return (
        f"The record {record} disagrees with the checkpoint beside it ({file}): {'; '.join(problems[:6])}"
        f"{f'; and {len(problems) - 6} more' if len(problems) > 6 else ''}. A resume continues what the checkpoint "
        "holds, so the record was edited (or copied from another run) after the run wrote it, and resuming would "
        f"either obey it or quietly ignore it. Nothing was written. Restore the record, or move {record} away to "
        "resume with the checkpoint's settings (the resume then writes a new record)."
    )


def named_keys(overrides: Sequence[str], composed: dict, defaults: dict) -> Iterator[tuple[str, str]]:
    """(group, key) of each setting the overrides name: a group option (loss=hinge) names its group's keys,
    and one that is no group of the config (debug=tiny) the keys it moves from their defaults."""
    for override in overrides:
        path = override_key(override).split(".")
        if len(path) == 2:
            yield path[0], path[1]
        elif len(path) == 1 and path[0] in composed:
            yield from ((path[0], key) for key in composed[path[0]])
        elif len(path) == 1:
            yield from (
                (group, key)
                for group, values in composed.items()
                if isinstance(values, dict)
                for key, value in values.items()
                if defaults.get(group, {}).get(key) != value
            )


def differences(name: str, recorded: dict, stored: dict, keys: Optional[set[tuple[str, str]]] = None) -> list[str]:
    """`name`'s settings unknown to the checkpoint, and those outside RESUMABLE it gives another value."""
    found = []
    for group, values in recorded.items():
        if group == "hydra" or not isinstance(values, dict):
            continue
        for key, value in values.items():
            if keys is not None and (group, key) not in keys:
                continue
            if key not in stored.get(group, {}):
                found.append(f"{name} has {group}.{key}={value!r}, which is no setting of the checkpoint")
            elif key not in RESUMABLE.get(group, ()) and stored[group][key] != value:
                found.append(f"{name} has {group}.{key}={value!r} where the checkpoint has {stored[group][key]!r}")
    return found


def given_settings(wanted: dict) -> list[tuple[str, str]]:
    """The settings this command names (even at their default) or sets through a group (`loss=hinge`)."""
    named = {override_key(o) for o in HydraConfig.get().overrides.task}
    defaults = to_dict(compose(config_name=HydraConfig.get().job.config_name))
    return [
        (group, key)
        for group, values in wanted.items()
        if isinstance(values, dict)
        for key, value in values.items()
        if f"{group}.{key}" != "trainer.resume"
        and (f"{group}.{key}" in named or defaults.get(group, {}).get(key) != value)
    ]


def resume_auto(config: dict, output_dir: Path, outputs: Path = Path("outputs")) -> Optional[Path]:
    """This job's own checkpoint, else the newest matching one under `outputs`."""
    own = output_dir / "checkpoints" / "last.pt"
    if own.is_file():
        return own
    wanted = run_identity(config, RUNTIME_KEYS)
    for last in sorted(outputs.glob("**/checkpoints/last.pt"), key=os.path.getmtime, reverse=True):
        recorded = last.parent.parent / RECORD / "config.yaml"
        try:
            if run_identity(to_dict(OmegaConf.load(recorded)), RUNTIME_KEYS) == wanted:
                return last
        except (OSError, yaml.YAMLError, OmegaConfBaseException, AttributeError):  # no record, or a damaged one
            continue
    return None


def check_resume(cfg: dict, checkpoint: Mapping[str, Any], source: str) -> None:
    """The resume contract: ConfigError naming each change outside RESUMABLE, or a max_steps below the step."""
    before = run_identity(stored_config(checkpoint["config"], source), RESUMABLE)
    after = run_identity(cfg, RESUMABLE)
    changed = [
        f"{group}.{key}: {before.get(group, {}).get(key)!r} -> {after.get(group, {}).get(key)!r}"
        for group in sorted(set(before) | set(after))
        for key in sorted(set(before.get(group, {})) | set(after.get(group, {})))
        if before.get(group, {}).get(key) != after.get(group, {}).get(key)
    ]
    if changed:
        may = ", ".join(f"{group}.{key}" for group, keys in RESUMABLE.items() for key in keys if key != "resume")
        raise ConfigError(
            f"trainer.resume={source}: this command changes what the run computes ({'; '.join(changed)}). "
            f"A resume may change only {may}. Nothing was written. Drop those overrides to continue the run, "
            "or drop trainer.resume to start a new run with them."
        )
    step, max_steps = int(checkpoint["step"]), cfg["trainer"]["max_steps"]
    if max_steps < step:
        raise ConfigError(
            f"trainer.max_steps={max_steps} is below the step of the checkpoint being resumed ({step}): "
            f"nothing would be trained. Nothing was written. Pass trainer.max_steps above {step} to train further."
        )
    if max_steps == step:
        log.info("The checkpoint is at step %d = trainer.max_steps: nothing left to train.", step)


def run_identity(config: dict, ignored: Mapping[str, Sequence[str]]) -> dict:
    """What makes two runs the same run: the config without hydra's section and the `ignored` keys."""
    return {
        group: {k: v for k, v in values.items() if k not in ignored.get(group, ())}
        for group, values in config.items()
        if group != "hydra" and isinstance(values, dict)
    }


def to_dict(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


# One owner per run folder, and no new run over an old one --------------------------------------------

LOCK_FILE = ".lock"
RECORD = ".hydra"  # Hydra's name for a job's record, so every tool that reads Hydra's runs finds it
_held: set[int] = set()  # lock file descriptors this process holds


@contextlib.contextmanager
def own_run_dir(run_dir: Path, resuming: Optional[Path], enabled: bool = True) -> Iterator[None]:
    """run_dir held for one run (rank 0's): its lock, no new run over a run, no resume into another
    run's folder, the temporary files of a killed run removed."""
    if not enabled:
        yield
        return
    lock = take_lock(run_dir)
    try:
        problem = existing_run(run_dir) if resuming is None else foreign_run(run_dir, resuming)
        if problem:
            raise RunDirError(problem)
        remove_stale_temp_files(run_dir / "checkpoints")
        yield
    finally:
        release_lock(lock, run_dir)


IN_USE = (
    "it is training or resuming this run). Nothing was written. Wait for it to finish, or stop it (kill -TERM writes "
    "a checkpoint first), then resume with trainer.resume=RUN_DIR; or choose another hydra.run.dir."
)


def take_lock(run_dir: Path, in_use: str = IN_USE) -> int:
    """flock() RUN_DIR/.lock (not O_EXCL: the kernel drops a flock when its holder dies, even by
    kill -9, so no lock is ever stale); the file holds 'PID HOST' for the messages."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(fd)
            os.close(fd)
            raise RunDirError(f"The run directory {run_dir} is in use: {holder} holds {path} ({in_use}") from None
        if still_named(fd, path):  # not unlinked by a holder that released it meanwhile
            break
        os.close(fd)
    previous = read_holder(fd)
    if previous:
        log.warning("Took over %s from %s, which ended without releasing it (killed?).", path, previous)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    _held.add(fd)
    return fd


def release_lock(fd: int, run_dir: Path) -> None:
    """Remove RUN_DIR/.lock, then drop the lock: one waiting on the old file sees it is gone."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(run_dir / LOCK_FILE)
    _held.discard(fd)
    os.close(fd)


def _close_held_locks_in_child() -> None:
    """A forked child (a DataLoader worker) must not keep the lock alive after its parent dies."""
    for fd in _held:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_held_locks_in_child)


def read_holder(fd: int) -> str:
    """'process 1234 on host node7' from the lock file's 'PID HOST', or '' when it is empty."""
    os.lseek(fd, 0, os.SEEK_SET)
    fields = os.read(fd, 200).decode(errors="replace").split()
    if not fields:
        return ""
    return f"process {fields[0]}" + (f" on host {fields[1]}" if len(fields) > 1 else "")


def still_named(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def existing_run(run_dir: Path) -> Optional[str]:
    """The refusal if run_dir holds a run (a checkpoint, or a record) or lies inside one, else None."""
    for folder in Path(os.path.abspath(run_dir)).parents:
        if holds_run(folder):
            return (
                f"{run_dir} lies inside the folder of another run, {folder}: a run there would write among "
                "that run's files. Nothing was written. Choose a hydra.run.dir outside it."
            )
    if (run_dir / "checkpoints" / "last.pt").is_file():
        return (
            f"{run_dir} already holds a run (checkpoints/last.pt): a new run there would overwrite its .hydra/ "
            f"record and replace its checkpoint. Nothing was written. Use trainer.resume={run_dir} to continue it, "
            "or another hydra.run.dir for a new run."
        )
    if (run_dir / RECORD / "overrides.yaml").is_file():
        return (
            f"{run_dir} already holds a run that wrote no checkpoint (its .hydra/ record, no checkpoints/last.pt: "
            "it stopped before its first checkpoint): a new run there would mix its logs with that run's. "
            "Nothing was written. Choose another hydra.run.dir, or delete that folder if its run is of no use."
        )
    return None


def holds_run(folder: Path) -> bool:
    return (folder / "checkpoints" / "last.pt").is_file() or (folder / RECORD / "overrides.yaml").is_file()


def foreign_run(run_dir: Path, checkpoint: Path) -> Optional[str]:
    """The refusal of a resume of `checkpoint` into run_dir while run_dir holds another run."""
    own = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None
    if (own is not None and same_folder(own, run_dir)) or existing_run(run_dir) is None:
        return None
    return (
        f"trainer.resume={checkpoint} would continue its run in {run_dir}, which holds another run: its "
        "checkpoint and .hydra/ record would be replaced. Nothing was written. Drop hydra.run.dir to continue "
        "the run in its own folder, or name a new folder for the continuation."
    )


def same_folder(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


# What each folder of a run holds, for the messages; the record's files and the log are written by keep_record
OUTPUT_FOLDERS = {
    RECORD: "its record",
    "checkpoints": "its checkpoints",
    "samples": "its sample grids",
    "tb": "its TensorBoard events",
    "tb/final_eval": "its final evaluation's TensorBoard events",
    "eval": "its final evaluation",
    "eval/tb": "its final evaluation's TensorBoard events",
}
OUTPUT_FILES = ("*.log", f"{RECORD}/*.yaml", "checkpoints/*.pt", "samples/*.png", "samples/*.gif", "eval/*")


def check_outputs(run_dir: Path) -> None:
    """Before the run writes anything: RunDirError naming the first place it writes that cannot take it (a
    file where it keeps a folder, a folder where it writes a file, a folder that refuses a new file). Tried,
    as unwritable_output does: permission bits do not tell a read-only mount or a full disk."""
    for folder, holds in [(run_dir, "its files"), *((run_dir / name, holds) for name, holds in OUTPUT_FOLDERS.items())]:
        if folder.exists() and not folder.is_dir():
            raise RunDirError(_cannot(folder, f"it is a file, where the run keeps a folder of {holds}", "Move it away"))
        if folder.is_dir() and (err := write_probe(folder)):
            fix = "Free disk space" if err.errno in (errno.ENOSPC, errno.EDQUOT) else "Make it writable"
            raise RunDirError(_cannot(folder, f"this folder of {holds} refuses a new file ({err.strerror})", fix))
    for pattern in OUTPUT_FILES:
        for path in sorted(run_dir.glob(pattern)):
            if path.is_dir() and not (path.parent.name == "eval" and path.name in ("tb", "export")):
                raise RunDirError(_cannot(path, "it is a folder, where the run writes a file", "Move it away"))


def _cannot(path: Path, problem: str, fix: str) -> str:
    return (
        f"Cannot write {path}: {problem}. Nothing was written: the run's record, log, TensorBoard events and "
        f"checkpoints are as they were. {fix}, then run the same command again."
    )


def remove_stale_temp_files(folder: Path) -> None:
    """The `.NAME.PID.tmp` files that checkpoint writers killed mid-write left, unless their process runs."""
    for tmp in sorted(folder.glob(".*.tmp")):
        pid = tmp.name.rsplit(".", 2)[-2]
        if not pid.isdigit() or alive(int(pid)):
            continue
        try:
            size = tmp.stat().st_size
            tmp.unlink()
        except FileNotFoundError:
            continue
        log.warning(
            "Removed %s (%.1f MB), left by process %s that died while writing a checkpoint.", tmp, size / 1e6, pid
        )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, and belongs to another user
        return True
    return True


# The record, written once every check has passed: Hydra would write .hydra/ and open its log file
# as the job starts, so a refused command would change the run it named. The configs switch both off.

LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's job_logging format


def write_record(run_dir: Path, cfg: DictConfig) -> None:
    """RUN_DIR/.hydra/{config,hydra,overrides}.yaml as Hydra writes them, replaced together: renames only."""
    hydra_cfg = HydraConfig.instance().cfg
    folder = run_dir / RECORD
    folder.mkdir(parents=True, exist_ok=True)
    nodes = {"config.yaml": cfg, "hydra.yaml": hydra_cfg, "overrides.yaml": hydra_cfg.hydra.overrides.task}
    partial = {name: folder / f".{name}.{os.getpid()}.tmp" for name in nodes}
    try:  # all three written before any is replaced: a full disk leaves the old record whole, and no temp file
        for name, node in nodes.items():
            with open(partial[name], "w", encoding="utf-8") as file:
                file.write(OmegaConf.to_yaml(node))
                file.flush()
                os.fsync(file.fileno())
        for name in nodes:
            os.replace(partial[name], folder / name)
    finally:
        for path in partial.values():
            path.unlink(missing_ok=True)


@contextlib.contextmanager
def held_log() -> Iterator[MemoryHandler]:
    """The job's log lines, held until keep_record opens the run's log file; lost if the job is refused."""
    held = MemoryHandler(capacity=sys.maxsize, flushLevel=logging.CRITICAL + 1)  # holds until a target is set
    root = logging.getLogger()
    root.addHandler(held)
    try:
        yield held
    finally:
        root.removeHandler(held)
        file = held.target
        held.close()  # writes what is still held to the file, if there is one
        if file is not None:
            file.close()


def keep_record(run_dir: Path, cfg: DictConfig, run_log: MemoryHandler) -> None:
    """The record and log file of a job that wrote something into run_dir."""
    write_record(run_dir, cfg)
    file = logging.FileHandler(run_dir / f"{HydraConfig.get().job.name}.log", encoding="utf-8")
    file.setFormatter(logging.Formatter(LOG_FORMAT))
    run_log.setTarget(file)
    run_log.flushLevel = logging.NOTSET  # from now on every line is written at once
    run_log.flush()


def remove_if_empty(run_dir: Path) -> None:
    """The folder Hydra made for a job that wrote nothing there, and the empty folders above it."""
    folder, stop = run_dir.absolute(), Path.cwd().absolute()
    while folder != stop and folder != folder.parent:
        try:
            folder.rmdir()  # only an empty folder
        except OSError:
            return
        folder = folder.parent


# Quoting: the printed resume line works when pasted ----------------------------------------------


def unquote(value: str) -> str:
    """A value as Hydra's override grammar reads it: 'a b' or "a b" (with its escapes) -> a b."""
    if not (len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""):
        return value
    try:
        parsed = OverridesParser.create().parse_override(f"key={value}").value()
    except HydraException:
        return value
    return parsed if isinstance(parsed, str) else value


def hydra_quote(path: Path | str) -> str:
    """A path as one Hydra value: quoted where needed (backslashes doubled only before a quote or the end)."""
    text = str(path)
    if not any(c in text for c in " =,[]{}()'\"\\:$"):
        return text
    out, run = [], 0
    for char in text:
        if char == "\\":
            run += 1
            continue
        out.append("\\" * (2 * run if char == "'" else run) + ("\\'" if char == "'" else char))
        run = 0
    out.append("\\" * (2 * run))
    return "'" + "".join(out) + "'"


def shell_quote(text: str) -> str:
    """`text` as one word of a POSIX shell, in double quotes where nothing in it is special there."""
    if text == shlex.quote(text) or any(c in text for c in '"$`\\!'):
        return shlex.quote(text)
    return f'"{text}"'


def resume_override(run_dir: Path) -> str:
    """`trainer.resume=RUN_DIR`, quoted for Hydra's grammar and then for the shell."""
    return shell_quote(f"trainer.resume={hydra_quote(run_dir)}")
