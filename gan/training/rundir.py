"""Run directories have one owner at a time, and a new run never replaces an old one.

Owns the guards around a run directory: the lock RUN_DIR/.lock that rank 0 holds while it trains,
the refusal of a new run where a run already is, or inside one (before Hydra starts, and again in
train()), the refusal of a resume into another run's folder, and the removal of the temporary
checkpoint files a killed run left behind. How a resume finds its run
directory is `gan.training.runs`; what a run writes there is `gan.training.loop`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
from pathlib import Path
from typing import Iterator, Optional

from gan.errors import RunDirError

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
# the record gan.training.record writes once a run's checks passed; Hydra's name for it
# (hydra.output_subdir's default), so every tool that reads Hydra's runs finds it
RECORD = ".hydra"
_held: set[int] = set()  # lock file descriptors this process holds


@contextlib.contextmanager
def own_run_dir(run_dir: Path, resuming: Optional[Path], enabled: bool = True) -> Iterator[None]:
    """Hold run_dir for one run: take its lock, refuse a new run where another run is, and a resume
    (`resuming`: the checkpoint file it continues) into the folder of a run other than its own;
    remove temporary files a killed run left behind; release the lock at the end. enabled=False
    (ranks other than 0, which write nothing) does nothing."""
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


def take_lock(run_dir: Path) -> int:
    """flock() RUN_DIR/.lock, or RunDirError naming the process that holds it; returns the descriptor.

    flock rather than a file created with O_EXCL: the kernel drops the lock when its holder dies,
    even by kill -9, so there is no stale lock to guess about (a PID may be reused, a host's PIDs mean
    nothing on another host of a shared file system). The file holds 'PID HOST' for the messages.
    Forked children (DataLoader workers) close their copy of the descriptor, so the lock dies with
    this process, not with the last of its workers.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirError(
                f"The run directory {run_dir} is in use: {holder} holds {path} (it is training or resuming "
                "this run). Wait for it to finish, or stop it (kill -TERM writes a checkpoint first), then "
                "resume with trainer.resume=RUN_DIR; or choose another hydra.run.dir."
            ) from None
        if _still_named(fd, path):  # not unlinked by a holder that released it meanwhile
            break
        os.close(fd)
    previous = _read_holder(fd)
    if previous:
        log.warning("Took over %s from %s, which ended without releasing it (killed?).", path, previous)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    _held.add(fd)
    return fd


def check_not_in_use(run_dir: Path) -> None:
    """Before Hydra starts a resume: RunDirError if another process holds the run's lock (tried and
    dropped at once; train() takes it for good), so a second resume is refused before its
    checkpoint is even read."""
    path = run_dir / LOCK_FILE
    if not path.is_file():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        raise RunDirError(
            f"The run directory {run_dir} is in use: {holder} holds {path} (it is training or resuming "
            "this run). Nothing was written. Wait for it to finish, or stop it (kill -TERM writes a "
            "checkpoint first), then resume with trainer.resume=RUN_DIR."
        ) from None
    finally:
        os.close(fd)


def release_lock(fd: int, run_dir: Path) -> None:
    """Remove RUN_DIR/.lock, then drop the lock: one waiting on the old file sees it is gone."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(run_dir / LOCK_FILE)
    _held.discard(fd)
    os.close(fd)


def _close_held_locks_in_child() -> None:
    """A forked child (a DataLoader worker) shares the parent's lock; it must not keep it alive after
    the parent dies."""
    for fd in _held:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_held_locks_in_child)


def _read_holder(fd: int) -> str:
    """'process 1234 on host node7' from the lock file's 'PID HOST', or '' when it is empty."""
    os.lseek(fd, 0, os.SEEK_SET)
    fields = os.read(fd, 200).decode(errors="replace").split()
    if not fields:
        return ""
    return f"process {fields[0]}" + (f" on host {fields[1]}" if len(fields) > 1 else "")


def _still_named(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def existing_run(run_dir: Path, untouched: str = "Nothing was written.") -> Optional[str]:
    """The refusal message if run_dir already holds a run (a checkpoint, or the .hydra/ record a run
    writes once its checks passed, before its first checkpoint) or lies inside one, else None."""
    for folder in Path(os.path.abspath(run_dir)).parents:
        if holds_run(folder):
            return (
                f"{run_dir} lies inside the folder of another run, {folder}: a run there would write among "
                f"that run's files. {untouched} Choose a hydra.run.dir outside it."
            )
    if (run_dir / "checkpoints" / "last.pt").is_file():
        return (
            f"{run_dir} already holds a run (checkpoints/last.pt): a new run there would overwrite its .hydra/ "
            f"record and replace its checkpoint. {untouched} Use trainer.resume={run_dir} to continue it, or "
            "another hydra.run.dir for a new run."
        )
    if (run_dir / RECORD / "overrides.yaml").is_file():
        return (
            f"{run_dir} already holds a run that wrote no checkpoint (its .hydra/ record, no checkpoints/last.pt: "
            f"it stopped before its first checkpoint): a new run there would mix its logs with that run's. "
            f"{untouched} Choose another hydra.run.dir, or delete that folder if its run is of no use."
        )
    return None


def holds_run(folder: Path) -> bool:
    """A run's folder: its last checkpoint, or the record a run writes before its first checkpoint."""
    return (folder / "checkpoints" / "last.pt").is_file() or (folder / RECORD / "overrides.yaml").is_file()


def foreign_run(run_dir: Path, checkpoint: Path) -> Optional[str]:
    """The refusal message if a resume of `checkpoint` would write into run_dir while run_dir holds
    another run than the checkpoint's own (`trainer.resume=RUN_A hydra.run.dir=RUN_B`), else None."""
    own = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None
    if (own is not None and _same_folder(own, run_dir)) or existing_run(run_dir) is None:
        return None
    return (
        f"trainer.resume={checkpoint} would continue its run in {run_dir}, which holds another run: its "
        "checkpoint and .hydra/ record would be replaced. Nothing was written. Drop hydra.run.dir to continue "
        "the run in its own folder, or name a new folder for the continuation."
    )


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def remove_stale_temp_files(folder: Path) -> None:
    """Remove the `.NAME.PID.tmp` files that save_checkpoint's writers left when they were killed
    mid-write (kill -9, power loss), keeping those whose process still runs."""
    for tmp in sorted(folder.glob(".*.tmp")):
        pid = tmp.name.rsplit(".", 2)[-2]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            size = tmp.stat().st_size
            tmp.unlink()
        except FileNotFoundError:  # removed meanwhile
            continue
        log.warning(
            "Removed %s (%.1f MB), left by process %s that died while writing a checkpoint.", tmp, size / 1e6, pid
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, and belongs to another user
        return True
    return True
