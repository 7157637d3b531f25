"""The errors a user can cause: each message is one paragraph naming the key or path at fault and what to do, and
the entry points turn any of them into exit code 2 (bad input). Anything else is a bug, and keeps its traceback."""

import contextlib
import errno
import os
from pathlib import Path
from typing import Iterator


class UserError(RuntimeError):
    """Bad input: a config value, a checkpoint, a dataset, an output folder or a measurement that cannot be made."""


class ConfigError(UserError, ValueError):
    """A config value that has the right type but cannot be used; the message names the key."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used; the message names the file and what is wrong with it."""


class DataError(UserError):
    """A dataset that cannot be loaded; the message says where it looked and what it expected."""


class MetricsError(UserError):
    """A measurement that cannot be made honestly; the message says why and what to change."""


def environment_error(err: OSError, then: str = "run the same command again.") -> UserError:
    where = os.fsdecode(err.filename) if err.filename else "a file"  # tensorboard's gfile names files in bytes
    reason = err.strerror or str(err) or type(err).__name__
    fix = _FIXES.get(err.errno, "Fix what the operating system reports")
    return UserError(f"Cannot use {where}: {reason} (errno {err.errno}). {fix}, then {then}")


_FIXES = {
    errno.ENOSPC: "Free disk space",
    errno.EDQUOT: "Free space within your disk quota",
    errno.EFBIG: "The file outgrew the largest file allowed here (ulimit -f, or the file system's limit): raise it",
    **dict.fromkeys((errno.EACCES, errno.EPERM), "Give this user write permission there"),
    errno.EROFS: "The file system is mounted read-only: write the run to another folder (hydra.run.dir=PATH)",
    errno.ENOTDIR: "A file stands where the run needs a folder: move it away",
    errno.EISDIR: "A folder stands where the run writes a file: move it away",
    errno.EIO: "The disk reported an I/O error: check it",
}


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError raised inside as one that names `path` when it names no file (a write to an open file)."""
    try:
        yield
    except OSError as err:
        if err.filename:
            raise
        raise OSError(err.errno, err.strerror or str(err), str(path)) from err


class RunDirError(UserError):
    """A run directory that cannot be used now: another process holds it, or a new run would replace its run."""
