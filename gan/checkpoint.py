"""Checkpoints: one plain dict, written atomically, loaded safely, checked against the config.

Owns the on-disk format and every way reading it can fail. The checkpoint holds only tensors and
plain containers (state dicts, ints, strings, tuples, the config as nested dicts), so it loads with
`torch.load(path, weights_only=True)`: a file that smuggles in any other Python object is refused
instead of executed. What goes into the dict is decided by `gan.training`.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from gan.errors import CheckpointError

# What every checkpoint of this project holds: last.pt (the whole training state) and best.pt (the
# generator alone, `kind: best`). Resuming needs more, and says which entry is missing.
REQUIRED_KEYS = ("G", "step", "config")
BEST = "best"  # the `kind` of checkpoints/best.pt


def require_training_state(state: Mapping[str, Any], source: str) -> None:
    """Refuse to resume from a checkpoint that holds a generator only (best.pt), in one paragraph."""
    if state.get("kind") == BEST:
        raise CheckpointError(
            f"{source} is a best.pt: the generator with the best in-training FID, kept for evaluate.py and "
            "export, without D or the optimizers' state, so training cannot continue from it. Resume from the "
            "run's last.pt (trainer.resume=RUN_DIR), or evaluate this one: python evaluate.py checkpoint=" + source
        )


def save_checkpoint(state: Mapping[str, Any], path: Path) -> None:
    """Write `state` to `path` atomically: a crash mid-write leaves the previous file intact.

    torch.save writes in place (pytorch#2883), so it goes to a temporary file in the same folder
    (same file system, so the rename is atomic), is flushed to disk, then os.replace()d over `path`.
    A write the file system refuses (disk full, quota, file size limit) raises OSError naming `path`,
    also where torch's zip writer reports it as a RuntimeError (the entry points report an OSError). A process
    killed mid-write leaves its temporary file: the next run in the folder removes it
    (gan.training.rundir). What `state` holds is the caller's business: the training loop checks its
    weights are finite before it calls this (gan.training.faults.check_finite_state).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(dict(state), f)
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
    """Keep `last` also as step_NNNNNN.pt beside it, and only the `keep` newest such files (0: none).

    A hard link costs no second write; last.pt is later replaced by a new file, not rewritten,
    so the numbered name keeps this step's contents.
    """
    if keep <= 0:
        return
    numbered = last.with_name(f"step_{step:06d}.pt")
    numbered.unlink(missing_ok=True)
    try:
        os.link(last, numbered)
    except OSError:  # a file system without hard links
        shutil.copyfile(last, numbered)
    for old in sorted(last.parent.glob("step_*.pt"))[:-keep]:
        old.unlink()


def checkpoint_path(path: str | Path) -> Path:
    """A checkpoint file, or a run directory -> its checkpoints/last.pt."""
    path = Path(path).expanduser()
    if path.is_dir():
        return path / "checkpoints" / "last.pt"
    return path


def load_checkpoint(path: str | Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """Load and sanity-check a checkpoint file or run directory; raises CheckpointError.

    map_location puts every tensor where this process wants it: a checkpoint written on a GPU
    loads on a CPU-only machine.
    """
    file = checkpoint_path(path)
    if not file.is_file():
        where = f"{path} (looked for {file})" if str(file) != str(path) else str(path)
        raise CheckpointError(
            f"Checkpoint not found: {where}. Pass a checkpoint file or a run "
            "directory that contains checkpoints/last.pt."
        )
    try:
        size = file.stat().st_size
    except OSError as err:
        raise CheckpointError(f"Cannot read {file}: {_describe(err)}.") from err
    if size == 0:
        raise CheckpointError(
            f"Cannot read {file}: it is an empty file (0 bytes), not a checkpoint. This project writes "
            f"checkpoints whole or not at all, so it was emptied or cut short elsewhere (a copy that failed?). "
            f"{_ELSEWHERE}"
        )
    try:
        state = torch.load(file, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        forbidden = _forbidden_global(err)
        if not forbidden:  # the safe unpickler met bytes it cannot parse, not a forbidden object
            raise _corrupt(file, err) from err
        raise CheckpointError(
            f"Refused to load {file}: it names {forbidden}, a Python object other than tensors and plain "
            "containers, and unpickling it could run arbitrary code. Checkpoints written by this project "
            "never do; do not trust this file."
        ) from err
    except OSError as err:  # unreadable: permissions, an I/O error
        raise CheckpointError(f"Cannot read {file}: {_describe(err)}.") from err
    except Exception as err:  # the unpickler fails in many ways on a damaged file (EOFError, IndexError, ...)
        raise _corrupt(file, err) from err
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED_KEYS):
        found = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"{file} is not a checkpoint of this project: expected a dict with "
            f"keys {list(REQUIRED_KEYS)}, found {found}."
        )
    return state


# Where to go from a checkpoint that cannot be read.
_ELSEWHERE = (
    "Resume or evaluate a numbered copy beside it (checkpoints/step_NNNNNN.pt, kept with "
    "trainer.keep_checkpoints=N), or start a new run."
)


def _corrupt(file: Path, err: Exception) -> CheckpointError:
    return CheckpointError(
        f"Cannot read {file}: it is truncated, corrupt or not a PyTorch file ({_describe(err)}). {_ELSEWHERE}"
    )


def _forbidden_global(err: Exception) -> str:
    """The 'GLOBAL posix.system' that torch's refusal names, or '' when it names none (damaged bytes)."""
    match = re.search(r"GLOBAL ([\w.]+)", str(err))
    return match.group(1) if match else ""


def _describe(err: BaseException) -> str:
    """'Type: what went wrong', in one line of at most 200 characters ('EOFError' alone when there is
    no message). torch's weights-only refusal opens with a paragraph about torch.load's defaults; its
    reason ('Unsupported operand 52') follows 'WeightsUnpickler error:'."""
    text = str(err)
    reason = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
    lines = [reason.group(1)] if reason else text.strip().splitlines()
    return f"{type(err).__name__}: {lines[0].strip()[:200]}" if lines else type(err).__name__


def load_module_state(module: nn.Module, state: Mapping[str, torch.Tensor], name: str) -> None:
    """load_state_dict with a readable error listing every missing, unexpected or resized tensor."""
    own = module.state_dict()
    problems = [
        f"{key}: {tuple(value.shape)} in the checkpoint, {tuple(own[key].shape)} in the model"
        for key, value in state.items()
        if key in own and own[key].shape != value.shape
    ]
    problems += [f"{key}: missing from the checkpoint" for key in own if key not in state]
    problems += [f"{key}: in the checkpoint, not in the model" for key in state if key not in own]
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        raise CheckpointError(
            f"The checkpoint's {name} does not match the {name} built from the config: {shown}. "
            "Use the same model.* and data.image_size/data.channels as the run that wrote it."
        )
    module.load_state_dict(state)
