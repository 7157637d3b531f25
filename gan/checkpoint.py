"""Checkpoints: one dict of tensors and plain containers, written atomically, loaded weights_only, checked."""

import errno
import os
import pickle
import re
import shutil
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Mapping, Optional, Sequence, TypeVar

import torch
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException
from torch import Tensor, nn

from gan.config import TrainConfig
from gan.errors import CheckpointError
from gan.run import Run

Name = TypeVar("Name", bound=Hashable)  # a tensor's name: a string, or a (part, key) pair

REQUIRED_KEYS = ("G", "step", "config", "num_classes")  # held by last.pt and best.pt alike
BEST = "best"  # the `kind` of checkpoints/best.pt
FORMAT = 2  # the layout's version, written by save_checkpoint; any other is refused. 2: trainer.on_d_won, d_won_window
RESUME = "resume from"


def require_training_state(state: Mapping[str, Any], source: str | Path) -> None:
    """The resume gate: refuse a best.pt, a missing or malformed resume entry, or a NaN/inf tensor."""
    file = checkpoint_path(source)
    if state.get("kind") == BEST:
        raise CheckpointError(
            f"{source} is a best.pt: the generator with the best in-training FID, without D or the optimizers, so "
            "training cannot continue from it. Resume from the run's last.pt (trainer.resume=RUN_DIR), or evaluate "
            f"this one: python evaluate.py checkpoint={source}"
        )
    missing = [entry for entry in ("D", "opt_g", "opt_d", "data", "fixed_z") if entry not in state]
    if missing:
        raise CheckpointError(
            f"Cannot resume from {file}: its entry {missing[0]!r} is missing. {another_checkpoint(file, RESUME)}"
        )
    _check_state_dict(state, "D", file, RESUME)
    for entry in ("opt_g", "opt_d"):
        _check_optimizer(state[entry], entry, file)
    data = state["data"]
    if not isinstance(data, Mapping) or not all(_whole(data.get(key)) for key in ("epoch", "batch")):
        what = "the batch stream's position, {'epoch': E, 'batch': B} with whole numbers of 0 or more"
        raise _damaged(file, "data", f"it holds {_shown(data)}, where this project writes {what}", RESUME)
    if data["epoch"] + data["batch"] > state["step"]:  # each step takes one batch; the epoch's size: training.state
        at = f"epoch {data['epoch']}, batch {data['batch']}"
        why = f"{state['step']} steps (its entry 'step') cannot reach: each step takes one batch"
        raise _damaged(file, "data", f"it places the batch stream at {at}, where {why}", RESUME)
    if not isinstance(state["fixed_z"], Tensor) or not state["fixed_z"].is_floating_point():
        what = "not the run's latents for its sample grids (a floating-point tensor)"
        raise _damaged(file, "fixed_z", f"it holds {_shown(state['fixed_z'])}, {what}", RESUME)
    bad, total = nonfinite(training_tensors(state))
    if bad:
        shown = ", ".join(bad[:4]) + (", ..." if len(bad) > 4 else "")
        raise CheckpointError(
            f"Cannot resume from {file}: it holds NaN or inf in {len(bad)} of its {total} floating-point tensors "
            f"({shown}). The checkpoint is damaged and training cannot continue from it: every step would start "
            f"from these values. {another_checkpoint(file, RESUME)}"
        )


def training_tensors(state: Mapping[str, Any]) -> Iterable[tuple[str, Tensor]]:
    for entry in ("G", "D", "G_ema"):
        for key, value in (state.get(entry) or {}).items():
            yield f"{entry}.{key}", value
    for entry in ("opt_g", "opt_d"):
        for index, slots in state[entry]["state"].items():
            for slot, value in slots.items():
                yield f"{entry}.state[{index}].{slot}", value
    yield "fixed_z", state["fixed_z"]


def nonfinite(named: Iterable[tuple[Name, Any]]) -> tuple[list[Name], int]:
    """The floating tensors of `named` holding NaN/inf, and their count; one host sync when all are finite."""
    tensors = [(name, t.detach()) for name, t in named if isinstance(t, Tensor) and t.is_floating_point()]
    if not tensors:
        return [], 0
    norms = torch._foreach_norm([t for _, t in tensors])
    if torch.stack([n.float() for n in norms]).isfinite().all():  # else recheck: huge finite values overflow a norm
        return [], len(tensors)
    return [name for name, t in tensors if not torch.isfinite(t).all()], len(tensors)


def save_checkpoint(state: Mapping[str, Any], path: Path) -> None:
    save_atomically({**state, "format": FORMAT}, path)


def save_atomically(obj: Any, path: Path) -> None:
    """torch.save `obj` whole or not at all (torch.save writes in place, pytorch#2883): temp file, fsync,
    os.replace; the temp file is removed whatever stops the write (a full disk, Ctrl-C)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except RuntimeError as err:  # torch's zip writer reports a failed write of `f` as a RuntimeError
        if isinstance(err.__context__, OSError):  # ... raised while the file's own OSError was handled
            raise OSError(err.__context__.errno, err.__context__.strerror, str(path)) from err
        if "PytorchStreamWriter" not in str(err) and "inline_container" not in str(err):
            raise
        raise OSError(errno.EIO, f"torch.save could not write it ({_describe(err)})", str(path)) from err
    finally:
        tmp.unlink(missing_ok=True)


def keep_numbered(last: Path, step: int, keep: int) -> None:
    """Also keep `last` as step_NNNNNN.pt, only the `keep` newest (0: none)."""
    if keep <= 0:
        return
    numbered = last.with_name(f"step_{step:06d}.pt")
    numbered.unlink(missing_ok=True)
    try:
        os.link(last, numbered)  # no second write; last.pt is replaced, not rewritten, so this keeps its contents
    except OSError:  # a file system without hard links
        shutil.copyfile(last, numbered)
    for old in sorted(last.parent.glob("step_*.pt"))[:-keep]:
        old.unlink()


def checkpoint_path(path: str | Path) -> Path:
    """A checkpoint file, or a run directory -> its checkpoints/last.pt."""
    path = Path(path).expanduser()
    return Run(path).last if path.is_dir() else path


def load_checkpoint(path: str | Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """Load and sanity-check a checkpoint file or run directory onto `map_location`; CheckpointError."""
    if not str(path).strip():  # Path("") is the launch directory: its checkpoints/last.pt is no one's choice
        raise CheckpointError("The checkpoint path is empty (an unset shell variable?). Name a checkpoint or run.")
    file = checkpoint_path(path)
    if not file.is_file():
        where = f"{path} (looked for {file})" if str(file) != str(path) else str(path)
        raise CheckpointError(
            f"Checkpoint not found: {where}. Pass a checkpoint file or a run directory that contains "
            f"checkpoints/last.pt.{kept_instead(file)}"
        )
    try:
        with open(file, "rb") as f:
            head = f.read(4)
    except OSError as err:  # permissions, an I/O error
        raise CheckpointError(f"Cannot read {file}: {_describe(err)}.") from err
    if not head:
        raise CheckpointError(
            f"Cannot read {file}: it is an empty file (0 bytes), not a checkpoint. This project writes checkpoints "
            f"whole, so it was emptied elsewhere (a copy that failed?). {another_checkpoint(file)}"
        )
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol warning would print over the one paragraph
            warnings.simplefilter("ignore")
            state = torch.load(file, map_location=map_location, weights_only=True)
    except Exception as err:  # the unpickler fails in many ways on a damaged file (UnpicklingError, EOFError, ...)
        forbidden = re.search(r"GLOBAL ([\w.]+)", str(err)) if isinstance(err, pickle.UnpicklingError) else None
        if forbidden:  # torch's refusal names the object; damaged bytes name none
            raise CheckpointError(
                f"Refused to load {file}: it names {forbidden.group(1)}, a Python object other than tensors and "
                "plain containers, and unpickling it could run arbitrary code. Checkpoints written by this project "
                "never do; do not trust this file."
            ) from err
        truncated = head == b"PK\x03\x04" and not zipfile.is_zipfile(file)  # a zip's end record comes last
        what = f"torch.save's zip archive cut short at {file.stat().st_size} bytes, its end missing"
        what = f"it is truncated: {what}" if truncated else f"it is corrupt or not a PyTorch file ({_describe(err)})"
        raise CheckpointError(f"Cannot read {file}: {what}. {another_checkpoint(file)}") from err
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED_KEYS):
        found = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"{file} is not a checkpoint of this project: expected a dict with keys {list(REQUIRED_KEYS)}, "
            f"found {found}."
        )
    if state.get("format") != FORMAT:
        found = _shown(state["format"]) if "format" in state else "none (written before checkpoints were numbered)"
        raise CheckpointError(
            f"{file} has checkpoint format {found}; this version reads format {FORMAT} only, so it was written by "
            "another version of this project. Use that version to resume or evaluate it, or start a new run."
        )
    for entry, (fits, what) in ENTRIES.items():  # once here, so no reader meets a wrong type (int(1.5) is a step)
        value = state.get(entry)
        if (value is not None or entry in REQUIRED_KEYS) and not fits(value):
            raise _damaged(file, entry, f"it holds {_shown(value)}, where this project writes {what}")
    _check_state_dict(state, "G", file)
    if state.get("G_ema") is not None:
        _check_state_dict(state, "G_ema", file)
    check_config_groups(state["config"], file)
    return state


def check_config_groups(config: object, source: str | Path, required: Sequence[str] = ()) -> None:
    if not isinstance(config, Mapping):
        raise _config_damaged(source, f"it is {_shown(config)}, not a mapping of groups (data, model, ...)")
    for group, values in config.items():
        if not isinstance(values, Mapping):
            raise _config_damaged(source, f"its group {group!r} is {_shown(values)}, not a mapping of settings")
    missing = [group for group in required if group not in config]
    if missing:
        raise _config_damaged(source, f"it has no {', '.join(repr(g) for g in missing)} group")


def stored_config(config: object, source: str | Path) -> dict:
    """A checkpoint's config typed by this version's schema (TrainConfig), as plain containers."""
    schema = OmegaConf.structured(TrainConfig)
    check_config_groups(config, source, required=list(schema))
    missing = [f"{group}.{key}" for group in schema for key in schema[group] if key not in config[group]]
    if missing:
        raise _config_damaged(source, f"it has no {', '.join(missing[:4])}")
    try:
        return OmegaConf.to_container(OmegaConf.merge(schema, config), resolve=True, enum_to_str=True)
    except (OmegaConfBaseException, ValueError) as err:
        raise stored_config_error(err, source) from err


def stored_config_error(err: Exception, source: str | Path, group: str = "") -> CheckpointError:
    """A stored config that does not fit the schema; `group`: the group merged alone (the key's prefix)."""
    key = str(getattr(err, "full_key", "") or "")
    key = f"{group}.{key}" if group and key else (key or group)
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    where = f"{key}: " if key else ""
    if not (isinstance(err, ConfigKeyError) or text.startswith("Invalid value")):
        return _config_damaged(source, f"{where}{text}")
    what = "is not a setting" if isinstance(err, ConfigKeyError) else "holds a choice that is not an option"
    file = checkpoint_path(source)
    return CheckpointError(
        f"The config stored in {file} does not fit this version's settings ({where}{text}): {key or 'it'} {what} "
        "of this version. Either the checkpoint was written by another version of this project (use that "
        f"version), or its config was edited after it was written. {another_checkpoint(file)}"
    )


def another_checkpoint(file: Path, use: str = "resume or evaluate") -> str:
    """What to `use` instead of a damaged `file`, naming only the copies that exist beside it."""
    if not file.is_file():  # a name, not a file: nothing to look beside
        return f"{use.capitalize()} another checkpoint of the run if trainer.keep_checkpoints kept any."
    try:
        copies = sorted(file.parent.glob("step_*.pt"), reverse=True)
        best = file.with_name(f"{BEST}.pt")
        copies += [best] if use == "evaluate" and best.is_file() else []
        copies = [c for c in copies if not os.path.samefile(c, file)]
    except OSError:  # an unlistable folder, a vanished file
        copies = []
    if not copies:
        kinds = "numbered copy (step_NNNNNN.pt)" + (" or best.pt" if use == "evaluate" else "")
        return (
            f"No {kinds} is kept beside it (trainer.keep_checkpoints=N keeps numbered copies), so {use} a copy "
            "of the file made before it was damaged, or start a new run."
        )
    if len(copies) == 1:
        return f"Another checkpoint is kept beside it: {use} {copies[0]} instead."
    names = ", ".join(c.name for c in copies[:3]) + (f" and {len(copies) - 3} more" if len(copies) > 3 else "")
    return f"Other checkpoints are kept beside it ({names}): {use} {copies[0]}, the newest, or another of them."


def _config_damaged(source: str | Path, problem: str) -> CheckpointError:
    file = checkpoint_path(source)
    return CheckpointError(
        f"The config stored in {file} is damaged: {problem}. This project writes it as a mapping of groups of "
        f"typed settings, so the file was altered after it was written. {another_checkpoint(file)}"
    )


def _damaged(file: Path, entry: str, problem: str, use: str = "resume or evaluate") -> CheckpointError:
    opening = "Cannot resume from" if use == RESUME else "Cannot use"
    return CheckpointError(
        f"{opening} {file}: its entry {entry!r} is damaged: {problem}. {another_checkpoint(file, use)}"
    )


def _whole(value: object) -> bool:  # an int of 0 or more; not a bool (True is an int to Python)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# The plain entries train.py and evaluate.py read, and what each holds (None: absent, where not required)
ENTRIES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "step": (_whole, "the number of generator updates done, a whole number of 0 or more"),
    "num_classes": (_whole, "the number of classes G was built for (0: unconditional)"),
    "kind": (lambda v: isinstance(v, str), "a name such as 'best'"),
    "threads": (lambda v: _whole(v) and v >= 1, "the torch thread count the run computed with, 1 or more"),
    "pack": (lambda v: isinstance(v, str), "the content hash of the pack the run trained from (data=packed)"),
    "best": (
        lambda v: isinstance(v, Mapping) and _real(v.get("fid")) and _whole(v.get("step")),
        "the best in-training FID and its step, {'fid': F, 'step': S}",
    ),
    "environment": (lambda v: isinstance(v, Mapping), "the versions and device it was written with, a mapping"),
}
# The settings of each parameter group that Adam's step reads (torch casts nothing: a str crashes its kernel)
ADAM_SETTINGS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "lr": (_real, "a number"),
    "betas": (lambda v: isinstance(v, (tuple, list)) and len(v) == 2 and all(map(_real, v)), "two numbers"),
    "eps": (_real, "a number"),
    "weight_decay": (_real, "a number"),
    "amsgrad": (lambda v: isinstance(v, bool), "True or False"),
    "maximize": (lambda v: isinstance(v, bool), "True or False"),
}
COUNTERS = ("num_batches_tracked", "n_averaged")  # the int64 buffers of a network's state dict; the rest are floats


def _shown(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(value).__name__})"


def _check_state_dict(state: Mapping[str, Any], entry: str, file: Path, use: str = "resume or evaluate") -> None:
    value = state[entry]
    if not isinstance(value, Mapping):
        raise _damaged(file, entry, f"it holds {_shown(value)}, not a network's state dict (its tensors by name)", use)
    for key, t in value.items():
        if not isinstance(key, str) or not isinstance(t, Tensor):
            raise _damaged(file, entry, f"{key!r} holds {_shown(t)}, where a state dict holds tensors", use)
        if not (t.is_floating_point() or key.endswith(COUNTERS)):  # load_state_dict would cast bools without a word
            raise _damaged(file, entry, f"{key!r} holds {t.dtype}, where a network's weights are floats", use)


def _check_optimizer(value: Any, entry: str, file: Path) -> None:
    """An optimizer's state dict as torch writes it: {'state': {index: {slot: tensor}}, 'param_groups': [dict]}."""
    if not isinstance(value, Mapping) or not isinstance(value.get("state"), Mapping):
        held = _shown(value) if not isinstance(value, Mapping) else f"'state' {_shown(value.get('state'))}"
        raise _damaged(file, entry, f"it holds {held}, not an optimizer's state dict", RESUME)
    groups = value.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, Mapping) for g in groups):
        what = f"its 'param_groups' is {_shown(groups)}, where torch writes a list of parameter groups"
        raise _damaged(file, entry, what, RESUME)
    for index, group in enumerate(groups):
        for key, (fits, what) in ADAM_SETTINGS.items():
            if not fits(group.get(key)):
                held = f"its param_groups[{index}].{key} holds {_shown(group.get(key))}"
                raise _damaged(file, entry, f"{held}, where Adam takes {what}", RESUME)
    if not all(isinstance(slots, Mapping) for slots in value["state"].values()):
        raise _damaged(file, entry, "its 'state' holds something other than each parameter's moments", RESUME)
    for index, slots in value["state"].items():  # torch would cast them to each parameter's type without a word
        for slot, moment in slots.items():
            if isinstance(moment, Tensor) and not moment.is_floating_point():
                held = f"its state[{index}].{slot} holds {moment.dtype}"
                raise _damaged(file, entry, f"{held}, where Adam keeps floats", RESUME)


def kept_instead(missing: Path) -> str:
    """The other checkpoints in the folder where `missing` was looked for, and what each is good for."""
    numbered, best = sorted(missing.parent.glob("step_*.pt")), missing.with_name(f"{BEST}.pt")
    found = f" {numbered[-1]} is a numbered copy: resume or evaluate it by its path." if numbered else ""
    if best.is_file():
        found += (
            f" {best} holds the generator with the best in-training FID: evaluate it (python evaluate.py "
            f"checkpoint={best}); training cannot resume from it (it holds no D or optimizers)."
        )
    return found


def _describe(err: BaseException) -> str:
    """'Type: first line' of `err`, or of the reason torch's weights-only refusal gives after its preamble."""
    text = str(err)
    reason = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
    lines = [reason.group(1)] if reason else text.strip().splitlines()
    return f"{type(err).__name__}: {lines[0].strip()[:200]}" if lines else type(err).__name__


def load_module_state(module: nn.Module, state: Mapping[str, Tensor], name: str, advice: Optional[str] = None) -> None:
    """load_state_dict with a readable error listing every mismatch; `advice` replaces the default hint."""
    own = module.state_dict()
    problems = [
        f"{key}: {tuple(value.shape)} in the checkpoint, {tuple(own[key].shape)} in the model"
        for key, value in state.items()
        if key in own and own[key].shape != value.shape
    ]
    problems += [f"{key}: missing from the checkpoint" for key in own if key not in state]
    problems += [f"{key}: in the checkpoint, not in the model" for key in state if key not in own]
    retyped = [
        f"{key}: {value.dtype} in the checkpoint, {own[key].dtype} in the model"
        for key, value in state.items()
        if key in own and own[key].dtype != value.dtype
    ]
    listed = problems or retyped
    shown = "; ".join(listed[:6]) + (f"; and {len(listed) - 6} more" if len(listed) > 6 else "")
    if problems:
        raise CheckpointError(
            f"The checkpoint's {name} does not match the {name} built from the config: {shown}. "
            + (advice or "Use the same model.* and data.image_size/data.channels as the run that wrote it.")
        )
    if retyped:  # load_state_dict would cast them without a word
        raise CheckpointError(
            f"The checkpoint's {name} holds tensors of another type than the {name} built from the config: {shown}. "
            "This project writes each tensor in its network's own type, so the checkpoint was altered after it was "
            "written: resume or evaluate another one."
        )
    module.load_state_dict(state)
