"""Run directories: how `trainer.resume=PATH` finds its way back into the run it continues.

Owns the rewriting of the command line before Hydra sees it. Hydra would otherwise compose the
config from the new command line alone and open a fresh timestamped directory; a resumed run must
instead keep the original settings and write into the original directory and TensorBoard run.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gan.training.checkpoint import checkpoint_path

log = logging.getLogger(__name__)

# trainer.* keys a resumed run may change without becoming a different run.
RESUMABLE_CHANGES = (
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
    "num_workers",
)

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
    larger trainer.max_steps), and hydra.run.dir=<run dir> makes Hydra write into it.
    `auto` picks the newest run under `outputs` whose config matches this command's (apart from
    RESUMABLE_CHANGES), or starts a new run if there is none: one command a cluster job can repeat.
    A checkpoint outside a run directory, and multirun, leave the command line as it is.
    """
    args = argv[1:]
    values = override_values(args, "trainer.resume")
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
    run_dir = file.parent.parent
    recorded_file = run_dir / ".hydra" / "overrides.yaml"
    if file.parent.name != "checkpoints" or not recorded_file.is_file():
        return argv
    given = {override_key(a) for a in args}
    recorded = yaml.safe_load(recorded_file.read_text()) or []
    replay = [o for o in recorded if override_key(o) not in given and override_key(o) not in _NOT_REPLAYED]
    run_dir_arg = [] if "hydra.run.dir" in given else [f"hydra.run.dir={_hydra_quote(run_dir)}"]
    return [argv[0], *replay, *args, *run_dir_arg]


def _hydra_quote(path: Path) -> str:
    """Quote a path for Hydra's override grammar when it holds characters the grammar reserves."""
    text = str(path)
    if any(c in text for c in " =,[]{}()'\"\\:"):
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


def find_matching_run(overrides: list[str], config_dir: Path, outputs: Path) -> Optional[Path]:
    """The newest run dir under `outputs` with a checkpoint and the config these overrides compose."""
    wanted = run_identity(_compose(overrides, config_dir))
    candidates = sorted(outputs.glob("**/checkpoints/last.pt"), key=os.path.getmtime, reverse=True)
    for last in candidates:
        recorded = last.parent.parent / ".hydra" / "config.yaml"
        if recorded.is_file() and run_identity(OmegaConf.to_container(OmegaConf.load(recorded))) == wanted:
            return last.parent.parent
    return None


def run_identity(config: dict) -> dict:
    """What makes two runs the same run: the config without the keys a resume may change."""
    identity = {group: dict(values) for group, values in config.items() if group != "hydra"}
    identity["trainer"] = {k: v for k, v in identity.get("trainer", {}).items() if k not in RESUMABLE_CHANGES}
    identity.get("data", {}).pop("num_workers", None)
    return identity


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
    """An error message if the folder Hydra will write this run into cannot be created, else None.

    Checked before Hydra starts, which would otherwise fail with a traceback.
    """
    args = argv[1:]
    key = "hydra.sweep.dir" if "-m" in args or "--multirun" in args else "hydra.run.dir"
    values = override_values(args, key)
    target = Path(values[-1].strip("'\"")) if values else Path("outputs")
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return None
    why = "is not a directory" if existing.exists() and not existing.is_dir() else "is not writable"
    return (
        f"Cannot write the run directory {target}: {existing} {why}. Choose a writable folder "
        f"with {key}=PATH (or launch from a writable directory)."
    )


def preflight(argv: list[str], exit_code: int = 2) -> None:
    """Before Hydra starts: log to stderr (until Hydra's logging config replaces this handler), and
    exit with `exit_code` and one logged paragraph if the run directory cannot be written."""
    logging.basicConfig(level=logging.INFO, format="[%(name)s][%(levelname)s] - %(message)s")
    problem = unwritable_output(argv)
    if problem:
        log.error("%s", problem)
        raise SystemExit(exit_code)
