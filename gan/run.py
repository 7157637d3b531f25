"""A run folder: its layout, who holds it, and what it must not be written over (a run's bookkeeping in one place,
as in StyleGAN2-ADA's training loop and minGPT); the entry points open a `Run` on Hydra's output folder."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import sys
from logging.handlers import MemoryHandler
from pathlib import Path
from typing import Iterator, NoReturn, Optional

from filelock import FileLock, Timeout
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from gan.errors import RunDirError

log = logging.getLogger(__name__)

LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's job_logging format
IN_USE = (
    "it is training or resuming this run). Nothing was written. Wait for it to finish, or stop it (kill -TERM writes "
    "a checkpoint first), then resume with trainer.resume=RUN_DIR; or choose another hydra.run.dir."
)


class Run:
    """A run folder: checkpoints/{last,best,step_N}.pt, tb/, samples/, eval/, metrics.json, .hydra/, NAME.log, .lock."""

    RECORD = ".hydra"  # Hydra's name for a job's record, so every tool that reads Hydra's runs finds it
    LOCK = ".lock"
    LAST = "checkpoints/last.pt"
    # each folder the run writes into, and what it holds (for the refusals)
    FOLDERS = {
        "": "its files",
        RECORD: "its record",
        "checkpoints": "its checkpoints",
        "samples": "its sample grids",
        "tb": "its TensorBoard events",
        "eval": "its final evaluation",
        "tb/final_eval": "its final evaluation's TensorBoard events",
        "eval/tb": "its final evaluation's TensorBoard events",
    }

    def __init__(self, folder: Path | str) -> None:
        self.dir = Path(folder)
        self.checkpoints, self.last = self.dir / "checkpoints", self.dir / self.LAST
        self.best = self.checkpoints / "best.pt"
        self.tb, self.samples, self.eval = self.dir / "tb", self.dir / "samples", self.dir / "eval"
        self.metrics = self.dir / "metrics.json"  # evaluate.py's numbers
        self.record = self.dir / self.RECORD

    @classmethod
    def of_checkpoint(cls, file: Path) -> Optional[Run]:
        """The run whose checkpoints/ folder holds `file`, or None for a loose checkpoint."""
        return cls(file.parent.parent) if file.parent.name == "checkpoints" else None

    def holds_run(self) -> bool:
        return self.last.is_file() or (self.record / "overrides.yaml").is_file()

    def existing_run(self) -> Optional[str]:
        """The refusal if this folder holds a run (a checkpoint, or a record) or lies inside one, else None."""
        for folder in Path(os.path.abspath(self.dir)).parents:
            if Run(folder).holds_run():
                return (
                    f"{self.dir} lies inside the folder of another run, {folder}: a run there would write among "
                    "that run's files. Nothing was written. Choose a hydra.run.dir outside it."
                )
        if self.last.is_file():
            return (
                f"{self.dir} already holds a run (checkpoints/last.pt): a new run there would overwrite its .hydra/ "
                f"record and replace its checkpoint. Nothing was written. Use trainer.resume={self.dir} to continue "
                "it, or another hydra.run.dir for a new run."
            )
        if self.holds_run():
            return (
                f"{self.dir} already holds a run that wrote no checkpoint (its .hydra/ record): a new run there would "
                "mix its logs with that run's. Nothing was written. Choose another hydra.run.dir, or delete that "
                "folder if its run is of no use."
            )
        return None

    def foreign_run(self, checkpoint: Path) -> Optional[str]:
        """The refusal of a resume of `checkpoint` into this folder while it holds another run."""
        own = Run.of_checkpoint(checkpoint)
        with contextlib.suppress(OSError):  # samefile: either folder may not exist yet
            if own is not None and os.path.samefile(own.dir, self.dir):
                return None
        if self.existing_run() is None:
            return None
        return (
            f"trainer.resume={checkpoint} would continue its run in {self.dir}, which holds another run: its "
            "checkpoint and .hydra/ record would be replaced. Nothing was written. Drop hydra.run.dir to continue "
            "the run in its own folder, or name a new folder for the continuation."
        )

    @contextlib.contextmanager
    def owned(self, in_use: str = IN_USE) -> Iterator[None]:
        """The folder's lock for the block: filelock's FileLock (flock on POSIX, msvcrt on Windows); the OS drops
        it when its holder dies, even by kill -9, so no lock is ever stale. The file names its holder."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / self.LOCK
        lock = FileLock(path, timeout=0, on_acquired=_write_holder)
        try:
            lock.acquire()
        except IsADirectoryError:
            _cannot(path, "it is a folder, where the run keeps its lock file", "Move it away")
        except Timeout:
            try:
                fields = path.read_text(errors="replace").split()
            except OSError:  # Windows: the holder's lock covers the file
                fields = []
            holder = f"process {' on host '.join(fields[:2])}" if fields else "another process"
            raise RunDirError(f"The run directory {self.dir} is in use: {holder} holds {path} ({in_use}") from None
        try:
            yield
        finally:
            lock.release()
            with contextlib.suppress(OSError):  # Windows: another process opened it meanwhile
                path.unlink()

    @contextlib.contextmanager
    def owned_for_training(self, resuming: Optional[Path]) -> Iterator[None]:
        """Held for one training run: no new run over a run, no resume into another run's folder, no stale temp file."""
        with self.owned():
            if problem := self.existing_run() if resuming is None else self.foreign_run(resuming):
                raise RunDirError(problem)
            self.remove_stale_temp_files()
            yield

    def check_outputs(self) -> None:
        """Before the run writes anything: RunDirError naming the first place it writes that cannot take it."""
        for name, holds in self.FOLDERS.items():
            if (folder := self.dir / name).exists() and not folder.is_dir():
                _cannot(folder, f"it is a file, where the run keeps a folder of {holds}", "Move it away")
            if folder.is_dir():
                self.check_writable(folder, holds)
        files = ("*.log", f"{self.RECORD}/*.yaml", "checkpoints/*.pt", "samples/*.png", "samples/*.gif", "eval/*")
        for pattern in files:
            for path in sorted(self.dir.glob(pattern)):
                if path.is_dir() and not (path.parent.name == "eval" and path.name in ("tb", "export")):
                    _cannot(path, "it is a folder, where the run writes a file", "Move it away")

    def check_writable(self, folder: Optional[Path] = None, holds: str = "its files") -> None:
        """RunDirError if `folder` (the run's own by default) refuses a file of one block: tried, as permission bits
        are wrong for root on a read-only mount or a spent quota (a full disk refuses the blocks, not the name)."""
        folder = folder or self.dir
        path, fd = folder / f".write-test-{os.getpid()}", None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            block = memoryview(bytes(4096))
            while block:  # a short write, then the error: a file-size limit or a disk that filled meanwhile
                block = block[os.write(fd, block) :]
            os.fsync(fd)
        except OSError as err:
            full = err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
            fix = "Free disk space (or raise the file-size limit)" if full else "Make it writable"
            _cannot(folder, f"this folder of {holds} refuses a new file ({err.strerror})", fix)
        finally:
            if fd is not None:
                os.close(fd)
                path.unlink(missing_ok=True)

    def remove_stale_temp_files(self) -> None:
        """The `.NAME.PID.tmp` files that checkpoint writers killed mid-write left, unless their process runs."""
        for tmp in sorted(self.checkpoints.glob(".*.tmp")):
            pid = tmp.name.rsplit(".", 2)[-2]
            if pid.isdigit() and not alive(int(pid)):
                with contextlib.suppress(FileNotFoundError):
                    size = tmp.stat().st_size
                    tmp.unlink()
                    log.warning("Removed %s (%.1f MB), left by process %s that died writing a checkpoint.",
                                tmp, size / 1e6, pid)  # fmt: skip

    def keep_record(self, cfg: DictConfig, held: MemoryHandler) -> None:
        """.hydra/*.yaml as Hydra writes them, then the job's log file with the lines held so far: Hydra would write
        both as the job starts, so a refused command would change the run it named (configs/*.yaml switch it off)."""
        hydra_cfg = HydraConfig.instance().cfg
        self.record.mkdir(parents=True, exist_ok=True)
        nodes = {"config.yaml": cfg, "hydra.yaml": hydra_cfg, "overrides.yaml": hydra_cfg.hydra.overrides.task}
        partial = {name: self.record / f".{name}.{os.getpid()}.tmp" for name in nodes}
        try:  # all three written before any is replaced: a full disk leaves the old record whole
            for name, node in nodes.items():
                with open(partial[name], "w", encoding="utf-8") as file:
                    file.write(OmegaConf.to_yaml(node))
                    file.flush()
                    os.fsync(file.fileno())
            for name in nodes:
                os.replace(partial[name], self.record / name)
        finally:
            for path in partial.values():
                path.unlink(missing_ok=True)
        handler = logging.FileHandler(self.dir / f"{hydra_cfg.hydra.job.name}.log", encoding="utf-8")
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        held.setTarget(handler)
        held.flushLevel = logging.NOTSET  # from now on every line is written at once
        held.flush()

    def outputs(self) -> list[Path]:
        return [p for p in self.dir.iterdir() if p.name != self.LOCK] if self.dir.is_dir() else []

    def remove_if_empty(self) -> None:
        """The folder Hydra made for a job that wrote nothing there, and the empty folders above it."""
        folder, stop = self.dir.absolute(), Path.cwd().absolute()
        while folder != stop and folder != folder.parent:
            try:
                folder.rmdir()  # only an empty folder
            except OSError:
                return
            folder = folder.parent


@contextlib.contextmanager
def held_log() -> Iterator[MemoryHandler]:
    """The job's log lines, held until Run.keep_record opens the run's log file; dropped if the job is refused."""
    held = MemoryHandler(capacity=sys.maxsize, flushLevel=logging.CRITICAL + 1)  # holds until a target is set
    logging.getLogger().addHandler(held)
    try:
        yield held
    finally:
        logging.getLogger().removeHandler(held)
        file = held.target
        held.close()  # writes what is still held to the file, if there is one
        if file is not None:
            file.close()


def _write_holder(fd: int) -> None:
    """filelock's on_acquired: this process's 'PID HOST' into the lock file, and a word about a holder that died."""
    os.lseek(fd, 0, os.SEEK_SET)
    if previous := os.read(fd, 200).decode(errors="replace").split():
        log.warning("Took over the run directory's lock from process %s, which ended without releasing it (killed?).",
                    " on host ".join(previous[:2]))  # fmt: skip
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())


def _cannot(path: Path, problem: str, fix: str) -> NoReturn:
    raise RunDirError(
        f"Cannot write {path}: {problem}. Nothing was written: the run's record, log, TensorBoard events and "
        f"checkpoints are as they were. {fix}, then run the same command again."
    ) from None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, and belongs to another user (Windows: no signal 0)
        return True
    return True
