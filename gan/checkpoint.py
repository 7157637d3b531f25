"""Checkpoints: one dict of tensors and plain containers, written atomically, loaded weights_only, checked."""

import errno
import itertools
import os
import pickle
import re
import shutil
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Mapping

import torch
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException
from torch import Tensor, nn

from gan.config import TrainConfig
from gan.errors import CheckpointError
from gan.run import Run

REQUIRED_KEYS = ("G", "step", "config", "num_classes")  # held by last.pt and best.pt alike
BEST = "best"  # the `kind` of checkpoints/best.pt
FORMAT = 2  # the layout's version, written by save_checkpoint; any other is refused. 2: trainer.on_d_won, d_won_window
RESUME = "resume from"
COUNTERS = ("num_batches_tracked", "n_averaged")  # the int64 buffers of a network's state dict; the rest are floats


def _whole(value: object) -> bool:  # an int of 0 or more; not a bool (True is an int to Python)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: object) -> str:
    text = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor) else repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(value).__name__})"


# Each entry's check returns what is wrong with its value, or "" when it is what this project writes
def _plain(fits: Callable[[Any], bool], what: str) -> Callable[[Any], str]:
    return lambda value: "" if fits(value) else f"it holds {_shown(value)}, where this project writes {what}"


def _state_dict(value: Any) -> str:
    if not isinstance(value, Mapping):
        return f"it holds {_shown(value)}, not a network's state dict (its tensors by name)"
    for key, t in value.items():
        if not isinstance(key, str) or not isinstance(t, Tensor):
            return f"{key!r} holds {_shown(t)}, where a state dict holds tensors"
        if not (t.is_floating_point() or key.endswith(COUNTERS)):  # load_state_dict would cast bools without a word
            return f"{key!r} holds {t.dtype}, where a network's weights are floats"
    return ""


def _optimizer(value: Any) -> str:  # torch's layout, {'state': {index: {slot: tensor}}, 'param_groups': [dict]}
    groups, slots = (value.get("param_groups"), value.get("state")) if isinstance(value, Mapping) else (None, None)
    laid_out = isinstance(slots, Mapping) and isinstance(groups, list)
    if not (laid_out and all(isinstance(part, Mapping) for part in [*slots.values(), *groups])):
        return f"it holds {_shown(value)}, not an optimizer's state dict ({{'state': ..., 'param_groups': [...]}})"
    for (index, group), (key, (fits, what)) in itertools.product(enumerate(groups), ADAM_SETTINGS.items()):
        if not fits(group.get(key)):
            return f"its param_groups[{index}].{key} holds {_shown(group.get(key))}, where Adam takes {what}"
    for index, moments in slots.items():  # torch would cast them to each parameter's type without a word
        for slot, moment in moments.items():
            if isinstance(moment, Tensor) and not moment.is_floating_point():
                return f"its state[{index}].{slot} holds {moment.dtype}, where Adam keeps floats"
    return ""


ENTRIES: dict[str, Callable[[Any], str]] = {  # what train.py and evaluate.py read of every checkpoint (None: absent)
    "step": _plain(_whole, "the number of generator updates done, a whole number of 0 or more"),
    "num_classes": _plain(_whole, "the number of classes G was built for (0: unconditional)"),
    "kind": _plain(lambda v: isinstance(v, str), "a name such as 'best'"),
    "threads": _plain(lambda v: _whole(v) and v >= 1, "the torch thread count the run computed with, 1 or more"),
    "pack": _plain(lambda v: isinstance(v, str), "the content hash of the pack the run trained from (data=packed)"),
    "best": _plain(
        lambda v: isinstance(v, Mapping) and _real(v.get("fid")) and _whole(v.get("step")), "{'fid': F, 'step': S}"
    ),
    "environment": _plain(lambda v: isinstance(v, Mapping), "the versions and device it was written with, a mapping"),
    **dict.fromkeys(("G", "G_ema"), _state_dict),
}
RESUME_ENTRIES: dict[str, Callable[[Any], str]] = {  # what a resume reads besides
    "D": _state_dict,
    **dict.fromkeys(("opt_g", "opt_d"), _optimizer),
    "data": _plain(
        lambda v: isinstance(v, Mapping) and all(_whole(v.get(key)) for key in ("epoch", "batch")),
        "the batch stream's position, {'epoch': E, 'batch': B} with whole numbers of 0 or more",
    ),
    "fixed_z": _plain(lambda v: isinstance(v, Tensor) and v.is_floating_point(), "the grids' latents, float tensor"),
}
ADAM_SETTINGS: dict[str, tuple[Callable[[Any], bool], str]] = {  # what Adam's step reads: torch casts none of them
    **dict.fromkeys(("lr", "eps", "weight_decay"), (_real, "a number")),
    "betas": (lambda v: isinstance(v, (tuple, list)) and len(v) == 2 and all(map(_real, v)), "two numbers"),
    **dict.fromkeys(("amsgrad", "maximize"), (lambda v: isinstance(v, bool), "True or False")),
}


def _damaged(source: str | Path, entry: str, problem: str, use: str = "resume or evaluate") -> CheckpointError:
    opening, file = "Cannot resume from" if use == RESUME else "Cannot use", checkpoint_path(source)
    status = f"damaged: {problem}" if problem else "missing"
    return CheckpointError(f"{opening} {file}: its entry {entry!r} is {status}. {another_checkpoint(file, use)}")


def require_training_state(state: Mapping[str, Any], source: str | Path) -> None:
    """The resume gate: refuse a best.pt, a missing or malformed resume entry, or a NaN/inf tensor."""
    file = checkpoint_path(source)
    if state.get("kind") == BEST:
        why = "G alone, without D or the optimizers, so training cannot continue from it. Resume from the run's last.pt"
        raise CheckpointError(f"{source} is a best.pt: {why} (trainer.resume=RUN_DIR), or evaluate it with evaluate.py")
    for entry, problem_of in RESUME_ENTRIES.items():
        if entry not in state or (problem := problem_of(state[entry])):
            raise _damaged(file, entry, problem if entry in state else "", RESUME)  # "": missing
    epoch, batch = state["data"]["epoch"], state["data"]["batch"]
    if epoch + batch > state["step"]:  # each step takes one batch; the epoch's size: training.state
        why = f"where {state['step']} steps (its entry 'step') cannot reach: each step takes one batch"
        raise _damaged(file, "data", f"it places the batch stream at epoch {epoch}, batch {batch}, {why}", RESUME)
    named = [(f"{entry}.{key}", t) for entry in ("G", "D", "G_ema") for key, t in (state.get(entry) or {}).items()]
    for entry in ("opt_g", "opt_d"):  # each parameter's Adam moments
        named += [(f"{entry}.state[{i}].{slot}", t) for i, s in state[entry]["state"].items() for slot, t in s.items()]
    bad, total = nonfinite([*named, ("fixed_z", state["fixed_z"])])
    if bad:
        shown = ", ".join(bad[:4]) + (", ..." if len(bad) > 4 else "")
        what = f"NaN or inf in {len(bad)} of its {total} floating-point tensors ({shown}). The checkpoint is damaged"
        why = f"{what} and training cannot continue from it: every step would start from these values"
        raise CheckpointError(f"Cannot resume from {file}: it holds {why}. {another_checkpoint(file, RESUME)}")


def nonfinite(named: Iterable[tuple[Hashable, Any]]) -> tuple[list, int]:
    """The floating tensors of `named` holding NaN/inf, and their count; one host sync when all are finite (else each
    is rechecked: huge finite values overflow a norm)."""
    tensors = [(name, t.detach()) for name, t in named if isinstance(t, Tensor) and t.is_floating_point()]
    if not tensors or torch.stack([n.float() for n in torch._foreach_norm([t for _, t in tensors])]).isfinite().all():
        return [], len(tensors)
    return [name for name, t in tensors if not torch.isfinite(t).all()], len(tensors)


def save_checkpoint(state: Mapping[str, Any], path: Path) -> None:
    save_atomically({**state, "format": FORMAT}, path)


def save_atomically(obj: Any, path: Path) -> None:
    """torch.save writes in place (pytorch#2883): a temp file, fsync, os.replace; the temp file never stays."""
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
        raise OSError(errno.EIO, f"torch.save could not write it ({describe(err)})", str(path)) from err
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
    if not str(path).strip():  # Path("") is the launch directory: its checkpoints/last.pt is no one's choice
        raise CheckpointError("The checkpoint path is empty (an unset shell variable?). Name a checkpoint or run.")
    file = checkpoint_path(path)
    if not file.is_file():
        where = f"{path} (looked for {file})" if str(file) != str(path) else str(path)
        numbered, best = sorted(file.parent.glob("step_*.pt")), file.with_name(f"{BEST}.pt")
        kept = f" {numbered[-1]} is a numbered copy: resume or evaluate it by its path." if numbered else ""
        if best.is_file():  # the generator alone
            kept += f" {best} holds G at its best FID: evaluate it (python evaluate.py checkpoint={best}), not resume."
        raise CheckpointError(f"Checkpoint not found: {where}. Pass a checkpoint file or a run directory.{kept}")
    try:
        with open(file, "rb") as f:
            head = f.read(4)
    except OSError as err:  # permissions, an I/O error
        raise CheckpointError(f"Cannot read {file}: {describe(err)}.") from err
    if not head:
        why = "it is an empty file (0 bytes), not a checkpoint: this project writes them whole, so it was emptied later"
        raise CheckpointError(f"Cannot read {file}: {why}. {another_checkpoint(file)}")
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol warning would print over the one paragraph
            warnings.simplefilter("ignore")
            state = torch.load(file, map_location=map_location, weights_only=True)
    except Exception as err:  # the unpickler fails in many ways on a damaged file (UnpicklingError, EOFError, ...)
        forbidden = re.search(r"GLOBAL ([\w.]+)", str(err)) if isinstance(err, pickle.UnpicklingError) else None
        if forbidden:  # torch's refusal names the object; damaged bytes name none
            why = "a Python object other than tensors and plain containers: unpickling it could run arbitrary code"
            raise CheckpointError(f"Refused to load {file}: it names {forbidden.group(1)}, {why}.") from err
        truncated = head == b"PK\x03\x04" and not zipfile.is_zipfile(file)  # a zip's end record comes last
        what = f"torch.save's zip archive cut short at {file.stat().st_size} bytes, its end missing"
        what = f"it is truncated: {what}" if truncated else f"it is corrupt or not a PyTorch file ({describe(err)})"
        raise CheckpointError(f"Cannot read {file}: {what}. {another_checkpoint(file)}") from err
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED_KEYS):
        found = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{file} is not a checkpoint of this project: keys {list(REQUIRED_KEYS)}, found {found}.")
    if state.get("format") != FORMAT:
        found = _shown(state["format"]) if "format" in state else "none (written before checkpoints were numbered)"
        why = f"this version reads format {FORMAT} only: use the version that wrote it, or start a new run"
        raise CheckpointError(f"{file} has checkpoint format {found}; {why}.")
    for entry, problem_of in ENTRIES.items():  # once here, so no reader meets a wrong type (int(1.5) is a step)
        value = state.get(entry)  # None: absent, which only a required entry may not be
        if (value is not None or entry in REQUIRED_KEYS) and (problem := problem_of(value)):
            raise _damaged(file, entry, problem)
    return state  # its config is checked where it is read: stored_config


def stored_config(config: object, source: str | Path, group: str = "") -> Any:
    """A checkpoint's config typed by this version's schema (TrainConfig), as plain containers; or its `group` alone
    over that group's defaults, as its dataclass (evaluate.py builds G from model and data only)."""
    schema = OmegaConf.structured(TrainConfig)
    if not isinstance(config, Mapping):
        raise _damaged(source, "config", f"it is {_shown(config)}, not a mapping of groups (data, model, ...)")
    for name, values in config.items():
        if not isinstance(values, Mapping):
            raise _damaged(source, "config", f"its group {name!r} is {_shown(values)}, not a mapping of settings")
    if missing := [name for name in ([group] if group else schema) if name not in config]:
        raise _damaged(source, "config", f"it has no {', '.join(repr(name) for name in missing)} group")
    if not group and (missing := [f"{g}.{key}" for g in schema for key in schema[g] if key not in config[g]]):
        raise _damaged(source, "config", f"it has no {', '.join(missing[:4])}")
    try:
        if group:
            return OmegaConf.to_object(OmegaConf.merge(schema, {group: config[group]})[group])
        return OmegaConf.to_container(OmegaConf.merge(schema, config), resolve=True, enum_to_str=True)
    except (OmegaConfBaseException, ValueError) as err:  # a value that types but does not build (an interpolation)
        key, text = str(getattr(err, "full_key", "") or ""), (str(err).strip() or type(err).__name__).splitlines()[0]
        where = f"{key}: " if key else ""
        if not (isinstance(err, ConfigKeyError) or text.startswith("Invalid value")):
            raise _damaged(source, "config", f"{where}{text}") from err
        what = "is not a setting" if isinstance(err, ConfigKeyError) else "holds a choice that is not an option"
        why = "Either another version of this project wrote it (use that version), or its config was edited since"
        misfit = f"does not fit this version's settings ({where}{text}): {key or 'it'} {what} of this version"
        file = checkpoint_path(source)
        raise CheckpointError(f"The config stored in {file} {misfit}. {why}. {another_checkpoint(file)}") from err


def another_checkpoint(file: Path, use: str = "resume or evaluate") -> str:
    """What to `use` instead of a damaged `file`, naming only the copies that exist beside it."""
    best = [file.with_name(f"{BEST}.pt")] if use == "evaluate" else []  # best.pt holds G alone: no resume
    try:
        copies = [c for c in sorted(file.parent.glob("step_*.pt"), reverse=True) + best if c.is_file()]
        copies = [c for c in copies if not (file.is_file() and os.path.samefile(c, file))]
    except OSError:  # an unlistable folder, a vanished file
        copies = []
    if not copies:
        why = f"(trainer.keep_checkpoints=N keeps them): {use} a copy made before it was damaged, or start a new run"
        return f"No numbered copy (step_NNNNNN.pt){' or best.pt' if best else ''} is kept beside it {why}."
    names = ", ".join(c.name for c in copies[:3]) + (f" and {len(copies) - 3} more" if len(copies) > 3 else "")
    return f"Checkpoints are kept beside it ({names}): {use} {copies[0]}, the newest, or another of them."


def describe(err: BaseException) -> str:
    """'Type: first sentence' of `err` (of a weights-only refusal: its reason; of TorchScript: its last line)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if any("Traceback of TorchScript" in line for line in lines):
        return lines[-1][:200]
    if weights_only := re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", str(err)):
        lines = [weights_only.group(1)]
    text = " ".join(lines).split(". ")[0][:200]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def load_module_state(module: nn.Module, state: Mapping[str, Tensor], name: str, advice: str) -> None:
    """load_state_dict with a readable error listing every mismatch, then `advice`: what to do."""
    own = module.state_dict()
    shapes = {k: (tuple(t.shape), tuple(own[k].shape)) for k, t in state.items() if k in own}
    dtypes = {k: (state[k].dtype, own[k].dtype) for k in shapes}  # load_state_dict would cast them
    problems = [f"{k}: {a} in the checkpoint, {b} in the model" for k, (a, b) in shapes.items() if a != b]
    problems += [f"{key}: missing from the checkpoint" for key in own if key not in state]
    problems += [f"{key}: in the checkpoint, not in the model" for key in state if key not in own]
    retyped = [f"{k}: {a} in the checkpoint, {b} in the model" for k, (a, b) in dtypes.items() if a != b]
    shown = "; ".join((problems or retyped)[:6]) + ("; and more" if len(problems or retyped) > 6 else "")
    if problems:
        raise CheckpointError(f"The checkpoint's {name} does not match the one the config builds: {shown}. {advice}")
    if retyped:
        why = "this project writes each in its network's own type, so the file was altered: use another one."
        raise CheckpointError(f"The checkpoint's {name} holds tensors of another type than its model's: {shown}; {why}")
    module.load_state_dict(state)
