"""Run directories: how `trainer.resume=PATH` finds its way back into the run it continues.

Owns the rewriting of the command line before Hydra sees it. Hydra would otherwise compose the
config from the new command line alone and open a fresh timestamped directory; a resumed run must
instead keep the original settings and write into the original directory and TensorBoard run. A
sweep's command line is rewritten too, so that its jobs are named by what differs between them.
"""

from __future__ import annotations

import logging
import os
import shlex
import tempfile
from pathlib import Path
from typing import Mapping, Optional

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import CompactHydraException, HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gan.checkpoint import checkpoint_path, load_checkpoint, require_training_state
from gan.config import TrainConfig, to_plain
from gan.errors import CheckpointError, ConfigError
from gan.training.rundir import check_not_in_use, existing_run

log = logging.getLogger(__name__)

# The resume contract. A resumed run may change two kinds of settings; they take effect (learning
# rates are set on the restored optimizers) and are recorded in the run's .hydra/ files and its next
# checkpoint. Any other change would make a different run: it is refused before anything is written.
# Settings of where and how the run executes, not of what it computes: `trainer.resume=auto` also
# ignores them when it looks for the run to continue.
RUNTIME_KEYS: dict[str, tuple[str, ...]] = {
    "data": ("root", "download", "in_memory", "num_workers"),  # where and how images are read, not which
    "trainer": (
        "max_steps",
        "resume",
        "device",
        "progress",
        "threads",
        "retain_host_memory",
        "log_every",
        "sample_every",
        "checkpoint_every",
        "keep_checkpoints",
        "final_eval_samples",
        "eval_every",  # measurements that change nothing of the run (gan/training/quality.py)
        "eval_samples",
        "overfit_every",  # likewise (gan/training/overfit.py)
        "on_collapse",  # the alarm watches; stop ends the run where a signal could have
        "collapse_window",
    ),
}
# Settings of the arithmetic that an explicit resume may change (to fine-tune with a lower rate, or
# to move a run to other hardware); `trainer.resume=auto` treats them as part of the run's identity,
# so a sweep over learning rates never continues another point's run.
TUNABLE_ON_RESUME: dict[str, tuple[str, ...]] = {
    "optim": ("lr", "lr_d", "lr_decay"),
    "trainer": ("precision", "compile", "channels_last", "on_nan", "deterministic"),
}


class SweepJobFailed(CompactHydraException):
    """A sweep job refused its input: Hydra prints this message alone, without a traceback, goes on
    with the other jobs, and exits 1 at the end of the sweep."""


# Keys that never carry over from the recorded command line of the run being resumed.
_NOT_REPLAYED = ("trainer.resume", "hydra.run.dir")


def override_key(override: str) -> str:
    """'+a.b=1' -> 'a.b'; 'loss=hinge' -> 'loss'."""
    return override.split("=", 1)[0].lstrip("+~")


def override_values(args: list[str], key: str) -> list[str]:
    """The values given to `key` on the command line, in order (the last one wins in Hydra)."""
    return [a.split("=", 1)[1] for a in args if override_key(a) == key and "=" in a]


def resume_argv(argv: list[str], config_dir: Path, outputs: Path = Path("outputs")) -> list[str]:
    """Rewrite `train.py trainer.resume=PATH|auto [overrides]` to continue a run where it stopped.

    A Hydra run directory records the overrides it was started with in .hydra/overrides.yaml.
    Replaying them before the new ones reproduces its config (the new ones win: for instance a
    larger trainer.max_steps), and hydra.run.dir=<run dir> makes Hydra write into it. Where there
    is no such record (a checkpoint outside a run directory, or a run whose record was lost), the
    settings stored in the checkpoint itself are replayed instead, key by key; a checkpoint outside
    a run directory continues in a new run directory.
    `auto` picks the newest run under `outputs` whose config matches this command's (apart from
    RUNTIME_KEYS), or starts a new run if there is none: one command a cluster job can repeat.
    Multirun leaves the command line as it is (each job resolves `auto` itself: auto_resume_in_job).
    """
    args = argv[1:]
    values = [unquote(v) for v in override_values(args, "trainer.resume")]
    if not values or values[-1] in ("", "null") or "-m" in args or "--multirun" in args:
        return argv
    if values[-1] == "auto":
        try:
            found = find_matching_run(args, config_dir, outputs)
        except (HydraException, OmegaConfBaseException):
            return argv  # a bad override: Hydra itself reports it, with its own message
        log.info("trainer.resume=auto: %s", f"continuing {found}" if found else "no matching run, starting one")
        args = [a for a in args if override_key(a) != "trainer.resume"]
        if found is None:
            return [argv[0], *args]
        args.append(f"trainer.resume={_hydra_quote(found)}")
        values = [str(found)]
    file = checkpoint_path(values[-1])
    in_run_dir = file.parent.name == "checkpoints"
    run_dir = file.parent.parent
    if in_run_dir:
        check_not_in_use(run_dir)  # a second resume of a run in use is refused before anything else
    state = load_checkpoint(file)
    require_training_state(state, str(file))
    given = {override_key(a) for a in args}
    recorded_file = run_dir / ".hydra" / "overrides.yaml"
    if in_run_dir and recorded_file.is_file():
        recorded = recorded_overrides(recorded_file)
    else:
        recorded = checkpoint_overrides(with_schema_defaults(state["config"], file), config_dir)
        why = f"{recorded_file} is missing" if in_run_dir else "it is not in a run directory"
        log.info("Resuming %s with the settings stored in it (%s).", file, why)
    replay = [o for o in recorded if override_key(o) not in given and override_key(o) not in _NOT_REPLAYED]
    try:
        replay += drifted(with_schema_defaults(state["config"], file), replay, args, config_dir)
    except (HydraException, OmegaConfBaseException):
        return argv  # a bad override: Hydra itself reports it, with its own message
    run_dir_arg = [] if "hydra.run.dir" in given or not in_run_dir else [f"hydra.run.dir={_hydra_quote(run_dir)}"]
    check_resume_command([*replay, *args], state, file, config_dir)
    return [argv[0], *replay, *args, *run_dir_arg]


def drifted(recorded: dict, replay: list[str], args: list[str], config_dir: Path) -> list[str]:
    """`group.key=value` for the run's settings that its replayed command line no longer gives, because
    a default changed since the run started (a newer version of this project), and that this command
    does not change either: replayed too, so the resume continues the run it names."""
    base, wanted = _compose(replay, config_dir), _compose([*replay, *args], config_dir)
    return [
        f"{group}.{key}={hydra_value(value)}"
        for group, values in recorded.items()
        if isinstance(values, dict) and group != "hydra"
        for key, value in values.items()
        if f"{group}.{key}" not in _NOT_REPLAYED
        and base.get(group, {}).get(key) != value
        and base.get(group, {}).get(key) == wanted.get(group, {}).get(key)
    ]


def checkpoint_overrides(config: dict, config_dir: Path) -> list[str]:
    """`group.key=value` for every setting of a checkpoint's config that differs from the defaults:
    the command line that reproduces it (trainer.resume aside)."""
    defaults = _compose([], config_dir)
    return [
        f"{group}.{key}={hydra_value(value)}"
        for group, values in config.items()
        if isinstance(values, dict) and group != "hydra"
        for key, value in values.items()
        if f"{group}.{key}" not in _NOT_REPLAYED and defaults.get(group, {}).get(key, object()) != value
    ]


def hydra_value(value: object) -> str:
    """A config value as Hydra's override grammar writes it (strings always quoted, so 'true' or
    '123' stay strings)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    quoted = _hydra_quote(str(value))
    return quoted if quoted.startswith("'") else f"'{quoted}'"


# Hydra's list of override keys left out of a job's override_dirname (configs/train.yaml sets it)
EXCLUDE_KEYS = "hydra.job.config.override_dirname.exclude_keys"


def sweep_argv(argv: list[str], config_dir: Path) -> list[str]:
    """Under -m, name each job by the overrides that vary across the sweep, and by nothing else.

    configs/train.yaml names a job `${hydra.job.num}_${hydra.job.override_dirname}`, and Hydra's
    override_dirname holds every override of the job: `-m optim.lr=1e-4,4e-4 trainer.threads=1`
    names its jobs `0_optim.lr=0.0001,trainer.threads=1`, which TensorBoard's run list cuts before
    the part that differs once a few constant overrides stand in front of it. Here the keys given a
    single value on the command line join override_dirname's exclude_keys (Hydra's own switch for
    this), as one more override: Hydra records it with the sweep, so a launcher that runs the jobs
    elsewhere (submitit) names them the same. A sweeper's own search space (hparams_search=optuna)
    is not on the command line and stays in the names. An exclude_keys given by hand wins.
    """
    args = argv[1:]
    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    if not ({"-m", "--multirun"} & set(args)) or any(override_key(a) == EXCLUDE_KEYS for a in overrides):
        return argv
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return argv  # a bad override: Hydra itself reports it, with its own message
    constant = [o.key_or_group for o in parsed if not o.is_sweep_override() and not o.key_or_group.startswith("hydra")]
    if not constant:
        return argv
    train_yaml = yaml.safe_load((config_dir / "train.yaml").read_text())
    standing = train_yaml["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"]
    keys = list(dict.fromkeys([*standing, *constant]))
    return [*argv, f"{EXCLUDE_KEYS}=[{','.join(repr(key) for key in keys)}]"]


def recorded_overrides(path: Path) -> list[str]:
    """The overrides a run was started with (its .hydra/overrides.yaml); ConfigError if unreadable."""
    try:
        recorded = yaml.safe_load(path.read_text()) or []
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ConfigError(
            f"Cannot resume from {path.parent.parent}: its {path} cannot be read ({type(err).__name__}). "
            "Restore the file, or resume from the checkpoint file itself (trainer.resume=RUN_DIR/checkpoints/"
            "last.pt hydra.run.dir=RUN_DIR) with the run's settings given again on the command line."
        ) from err
    if not isinstance(recorded, list) or not all(isinstance(o, str) for o in recorded):
        raise ConfigError(
            f"Cannot resume from {path.parent.parent}: {path} is not a list of overrides. Restore the file, "
            "or resume from the checkpoint file itself with the run's settings given again."
        )
    return recorded


def check_resume_command(overrides: list[str], state: dict, checkpoint: Path, config_dir: Path) -> None:
    """Refuse, before Hydra starts, a resume that changes what the run computes or that has nothing
    to train: the same checks as check_resume (which train() makes again), made on the checkpoint's
    own config, so the message comes at once."""
    try:
        wanted = _compose(overrides, config_dir)
    except (HydraException, OmegaConfBaseException):
        return  # a bad override: Hydra itself reports it, with its own message
    refuse_changes(with_schema_defaults(state["config"], checkpoint), wanted, str(checkpoint))
    check_steps(wanted["trainer"]["max_steps"], int(state["step"]))


def check_resume(cfg: TrainConfig, checkpoint: dict) -> None:
    """In train(), once the checkpoint is loaded: the resume contract against the checkpoint's own
    config (which also covers a checkpoint file outside a run directory), and a step to go to."""
    require_training_state(checkpoint, str(cfg.trainer.resume))
    refuse_changes(with_schema_defaults(checkpoint["config"], cfg.trainer.resume), to_plain(cfg), cfg.trainer.resume)
    check_steps(cfg.trainer.max_steps, int(checkpoint["step"]))


def check_steps(max_steps: int, step: int) -> None:
    """A resume must have somewhere to go: refused below the checkpoint's step, a no-op at it."""
    if max_steps < step:
        raise ConfigError(
            f"trainer.max_steps={max_steps} is below the step of the checkpoint being resumed ({step}): "
            f"nothing would be trained. Nothing was written. Pass trainer.max_steps above {step} to train further."
        )
    if max_steps == step:
        log.info("The checkpoint is at step %d = trainer.max_steps: nothing left to train.", step)


# Settings added to the schema with a default that is not what a run written before them computed: a
# stored config without the key reads as this value, so the run continues as it began. Before
# model.ada_target, model.diffaugment's policies applied to every image D saw: p = 1, ada_target=0.
# Before model.d_batchnorm and model.spectral_norm, D was DCGAN's (BatchNorm, no spectral norm), and
# Adam's beta1 was the DCGAN paper's 0.5.
BEFORE_THE_KEY: dict[str, dict[str, object]] = {
    "model": {"ada_target": 0.0, "d_batchnorm": True, "spectral_norm": False},
    "optim": {"beta1": 0.5},
}


def with_schema_defaults(config: object, source: object) -> dict:
    """A recorded config laid over the current schema's defaults, so that settings added to the schema
    after the run was written read as their defaults (or, in BEFORE_THE_KEY, as what the run computed).
    CheckpointError naming `source` if it does not fit: a config that is not a mapping of all the
    schema's groups, or a value of the wrong type, is a damaged file; only a key (or a choice) this
    version does not know may be another version's."""
    # imported here, not at the top: this function's change is kept apart from the rest of the module's
    from gan.checkpoint import check_config_groups, stored_config_error

    schema = OmegaConf.structured(TrainConfig)
    check_config_groups(config, str(source), required=list(schema))
    config = {  # a key added since the run was written, whose default is not what the run computed
        group: {**{k: v for k, v in BEFORE_THE_KEY.get(group, {}).items() if k not in values}, **values}
        if isinstance(values, Mapping)
        else values
        for group, values in config.items()
    }
    try:
        return OmegaConf.to_container(OmegaConf.merge(schema, config), resolve=True, enum_to_str=True)
    except (OmegaConfBaseException, ValueError) as err:
        raise stored_config_error(err, str(source)) from err


def refuse_changes(recorded: dict, wanted: dict, source: str) -> None:
    """ConfigError listing every setting that differs outside the resume contract."""
    allowed = {**RUNTIME_KEYS}
    for group, keys in TUNABLE_ON_RESUME.items():
        allowed[group] = (*allowed.get(group, ()), *keys)
    before, after = run_identity(recorded, allowed), run_identity(wanted, allowed)
    changed = [
        f"{group}.{key}: {before.get(group, {}).get(key)!r} -> {after.get(group, {}).get(key)!r}"
        for group in sorted(set(before) | set(after))
        for key in sorted(set(before.get(group, {})) | set(after.get(group, {})))
        if before.get(group, {}).get(key) != after.get(group, {}).get(key)
    ]
    if changed:
        may = ", ".join(f"{group}.{key}" for group, keys in allowed.items() for key in keys if key != "resume")
        raise ConfigError(
            f"trainer.resume={source}: this command changes what the run computes ({'; '.join(changed)}). "
            f"A resume may change only {may}. Nothing was written. Drop those overrides to continue the run, "
            "or drop trainer.resume to start a new run with them."
        )


def unquote(value: str) -> str:
    """A value as Hydra's override grammar reads it: 'a b' or "a b" (with its escapes) -> a b."""
    if not (len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""):
        return value
    try:
        parsed = OverridesParser.create().parse_override(f"key={value}").value()
    except HydraException:
        return value
    return parsed if isinstance(parsed, str) else value


def _hydra_quote(path: Path | str) -> str:
    """A path as one value of Hydra's override grammar: single-quoted when it holds a character the
    grammar reserves. Inside quotes a backslash is literal unless it ends the string or precedes a
    quote, so only those runs are doubled (Hydra's rule for quoted values)."""
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


def resume_override(run_dir: Path) -> str:
    """`trainer.resume=RUN_DIR`, quoted for Hydra's grammar and then for a POSIX shell: the line a
    stopped run prints works when pasted, whatever the folder's name holds (spaces, '=', quotes)."""
    return shell_quote(f"trainer.resume={_hydra_quote(run_dir)}")


def shell_quote(text: str) -> str:
    """`text` as one word of a POSIX shell: in double quotes when nothing in it is special there
    ("trainer.resume='a b'" reads better than shlex's '...'"'"'...), else as shlex quotes it."""
    if text == shlex.quote(text) or any(c in text for c in '"$`\\!'):
        return shlex.quote(text)
    return f'"{text}"'


def find_matching_run(overrides: list[str], config_dir: Path, outputs: Path) -> Optional[Path]:
    """The newest run dir under `outputs` with a checkpoint and the config these overrides compose."""
    return newest_matching_run(_compose(overrides, config_dir), outputs)


def auto_resume_in_job(run_dir: Path, config: dict, outputs: Path = Path("outputs")) -> Optional[str]:
    """What `trainer.resume=auto` continues in one job of a sweep (-m), whose folder Hydra chose: the
    job's own run when its folder holds one (the same sweep launched again with the same
    hydra.sweep.dir, or a requeued job), else the newest run under `outputs` with this job's config,
    continued in the job's folder (the original is left as it is), else nothing: a new run."""
    own = run_dir / "checkpoints" / "last.pt"
    found = own if own.is_file() else None
    if found is None:
        matching = newest_matching_run(config, outputs)
        found = matching / "checkpoints" / "last.pt" if matching is not None else None
    log.info("trainer.resume=auto: %s", f"continuing {found}" if found else "no matching run, starting one")
    return str(found) if found is not None else None


def newest_matching_run(config: dict, outputs: Path) -> Optional[Path]:
    """The newest run dir under `outputs` with a checkpoint and this config (RUNTIME_KEYS aside)."""
    wanted = run_identity(config, RUNTIME_KEYS)
    candidates = sorted(outputs.glob("**/checkpoints/last.pt"), key=os.path.getmtime, reverse=True)
    for last in candidates:
        recorded = last.parent.parent / ".hydra" / "config.yaml"
        try:
            config = with_schema_defaults(OmegaConf.to_container(OmegaConf.load(recorded)), recorded)
        except (OSError, OmegaConfBaseException, yaml.YAMLError, CheckpointError):
            continue  # not a run of this version (or no config): not the one to continue
        if run_identity(config, RUNTIME_KEYS) == wanted:
            return last.parent.parent
    return None


def run_identity(config: dict, ignored: dict[str, tuple[str, ...]]) -> dict:
    """What makes two runs the same run: the config without hydra's section and the `ignored` keys."""
    return {
        group: {k: v for k, v in values.items() if k not in ignored.get(group, ())}
        for group, values in config.items()
        if group != "hydra" and isinstance(values, dict)
    }


def _compose(overrides: list[str], config_dir: Path) -> dict:
    overrides = [
        o for o in overrides if not override_key(o).startswith("hydra") and override_key(o) != "trainer.resume"
    ]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base="1.3"):
            cfg = compose(config_name="train", overrides=overrides)
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    finally:
        GlobalHydra.instance().clear()


def unwritable_output(argv: list[str]) -> Optional[str]:
    """An error message if the folder Hydra will write this run into cannot be written, else None.

    Checked before Hydra starts, which would otherwise fail with a traceback. It is tried, not
    guessed from permission bits (which say yes to root on a read-only file system's parent, or
    on a folder whose quota is spent): what Hydra and the run's first writes need, a folder and a
    file with one block of data in it, is made in the nearest folder that exists, and removed.
    """
    args = argv[1:]
    key = "hydra.sweep.dir" if "-m" in args or "--multirun" in args else "hydra.run.dir"
    values = override_values(args, key)
    target = Path(unquote(values[-1])) if values else Path("outputs")
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:  # in the nearest existing folder: nothing is left behind
        if not existing.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(existing))
        with tempfile.TemporaryDirectory(dir=existing, prefix=".write-test-") as folder:
            with open(Path(folder) / "probe", "wb") as file:  # a full disk refuses the blocks, not the name
                file.write(bytes(4096))  # one block
                file.flush()
                os.fsync(file.fileno())
        return None
    except OSError as err:
        if existing.exists() and not existing.is_dir():
            why = f"{existing} is not a directory"
        else:
            why = f"{err.strerror or err} (the nearest existing folder is {existing})"
        return (
            f"Cannot write the run directory {target}: {why}. Choose a writable folder "
            f"with {key}=PATH (or launch from a writable directory)."
        )


def existing_run_in_argv(argv: list[str]) -> Optional[str]:
    """Before Hydra starts: existing_run() of the hydra.run.dir a command that is not a resume names.

    train() makes the same check before it writes anything; this one answers before Hydra and torch
    start, and is the only one evaluate.py has (its outputs would land among the run's files).
    """
    args = argv[1:]
    if "-m" in args or "--multirun" in args:
        return None
    resume = ([None] + [unquote(v) for v in override_values(args, "trainer.resume")])[-1]
    run_dir = ([None] + [unquote(v) for v in override_values(args, "hydra.run.dir")])[-1]
    if (resume not in (None, "", "null")) or not run_dir:
        return None
    return existing_run(Path(run_dir).expanduser(), "Nothing was written.")


def existing_sweep_in_argv(argv: list[str], resumable: bool = True) -> Optional[str]:
    """Before Hydra starts: the refusal message for a sweep (-m) into a hydra.sweep.dir that already
    holds a sweep, whose multirun.yaml Hydra would replace as it starts; None otherwise. A sweep
    launched again to continue its jobs (trainer.resume=auto: each job continues the run in its own
    folder) is what such a folder is for, and is let through."""
    args = argv[1:]
    if not ({"-m", "--multirun"} & set(args)):
        return None
    folder = ([None] + [unquote(v) for v in override_values(args, "hydra.sweep.dir")])[-1]
    resume = ([None] + [unquote(v) for v in override_values(args, "trainer.resume")])[-1]
    if folder is None or (resumable and resume == "auto"):
        return None
    if not (Path(folder).expanduser() / "multirun.yaml").is_file():
        return None
    again = "Add trainer.resume=auto to continue each job's run there, or choose" if resumable else "Choose"
    return (
        f"hydra.sweep.dir={folder} already holds a sweep (multirun.yaml): Hydra would replace its record, and "
        f"its jobs' folders hold its results. Nothing was written. {again} another hydra.sweep.dir for a new sweep."
    )


# Settings that name a file or folder: a path may hold what Hydra's grammar reserves ('=', ' ', ',')
PATH_KEYS = ("trainer.resume", "hydra.run.dir", "hydra.sweep.dir", "data.root", "checkpoint")


def unreadable_path(argv: list[str]) -> Optional[str]:
    """Before Hydra starts: the message for a path setting Hydra's grammar cannot read as given
    (`trainer.resume=outputs/multirun/.../0_optim.lr=0.002`, a sweep job's own folder name), which
    Hydra would report as "mismatched input '='" without naming the setting; None otherwise."""
    parser = OverridesParser.create()
    for arg in argv[1:]:
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
                f"Hydra inside the shell's quotes: {shell_quote(f'{key}={_hydra_quote(unquote(value))}')}"
            )
    return None


def preflight(argv: list[str], exit_code: int = 2, resumable: bool = True) -> None:
    """Before Hydra starts: log to stderr (until Hydra's logging config replaces this handler), and
    exit with `exit_code` and one logged paragraph if the run directory cannot be written, or if
    Hydra would write over an existing run's or sweep's record (`resumable`: train.py's runs)."""
    logging.basicConfig(level=logging.INFO, format="[%(name)s][%(levelname)s] - %(message)s")
    problem = (
        unreadable_path(argv)
        or unwritable_output(argv)
        or existing_run_in_argv(argv)
        or existing_sweep_in_argv(argv, resumable)
    )
    if problem:
        log.error("%s", problem)
        raise SystemExit(exit_code)
