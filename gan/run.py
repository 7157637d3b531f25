"""A run folder: its layout, its one owner at a time, and what it must not be written over (as StyleGAN2-ADA's)."""

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

import psutil
from filelock import FileLock, Timeout
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from gan.errors import RunDirError

log = logging.getLogger(__name__)
ELSEWHERE = "Choose another hydra.run.dir."
IN_USE = "it trains or resumes this run). Nothing was written. Wait for it, or stop it (kill -TERM checkpoints first)."


class Run:
    """A run folder: checkpoints/{last,best,step_N}.pt, tb/, samples/, eval/, metrics.json, .hydra/, NAME.log, .lock."""

    RECORD, LOCK, LAST = ".hydra", ".lock", "checkpoints/last.pt"  # .hydra: where Hydra's tools look for a record
    FOLDERS = ("", RECORD, "checkpoints", "samples", "tb", "eval", "tb/final_eval", "eval/tb")  # each one it writes in
    FILES = ("*.log", f"{RECORD}/*.yaml", "checkpoints/*.pt", "samples/*.png", "samples/*.gif", "eval/*")  # and files

    def __init__(self, folder: Path | str) -> None:
        self.dir = Path(folder)
        self.checkpoints, self.last = self.dir / "checkpoints", self.dir / self.LAST
        self.best = self.checkpoints / "best.pt"
        self.tb, self.samples, self.eval, self.record = map(self.dir.joinpath, ("tb", "samples", "eval", self.RECORD))
        self.metrics, self.export = self.dir / "metrics.json", self.dir / "export"  # evaluate.py's (export=: G's files)

    @classmethod
    def of_checkpoint(cls, file: Path) -> Optional[Run]:
        return cls(file.parent.parent) if file.parent.name == "checkpoints" else None

    def holds_run(self) -> bool:
        return self.last.is_file() or (self.record / "overrides.yaml").is_file()

    def existing_run(self) -> Optional[str]:
        if outer := next((f for f in Path(os.path.abspath(self.dir)).parents if Run(f).holds_run()), None):
            return f"{self.dir} lies inside the folder of another run, {outer}. Nothing was written. {ELSEWHERE}"
        if self.last.is_file():
            return f"{self.dir} already holds a run. Nothing was written. Use trainer.resume={self.dir} to continue it."
        if self.holds_run():
            return f"{self.dir} already holds a run's .hydra/ record. Nothing was written. {ELSEWHERE}"
        return None

    @contextlib.contextmanager
    def owned(self, in_use: str = IN_USE) -> Iterator[None]:
        """The folder's lock: filelock's (flock, msvcrt), which the OS drops when its holder dies, even by kill -9."""
        self.dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(path := self.dir / self.LOCK, timeout=0, on_acquired=_write_holder)
        try:
            lock.acquire()
        except IsADirectoryError:
            _cannot(path, "it is a folder, where the run keeps its lock file")
        except Timeout:
            fields: list[str] = []
            with contextlib.suppress(OSError):  # Windows: the holder's lock covers the file
                fields = path.read_text(errors="replace").split()[:2]
            holder = f"process {' on host '.join(fields)}" if fields else "another process"
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
            own, mine = Run.of_checkpoint(resuming) if resuming else None, False
            with contextlib.suppress(OSError):  # samefile: the checkpoint's folder may be gone
                mine = own is not None and os.path.samefile(own.dir, self.dir)
            if not mine and (problem := self.existing_run()):
                if resuming:
                    why = "which holds another run. Nothing was written. Drop hydra.run.dir, or name a new folder"
                    problem = f"trainer.resume={resuming} would continue its run in {self.dir}, {why}."
                raise RunDirError(problem)
            for tmp in sorted(self.checkpoints.glob(".*.tmp")):  # left by checkpoint writers killed mid-write
                pid = tmp.name.rsplit(".", 2)[-2]
                if pid.isdigit() and not psutil.pid_exists(int(pid)):  # (not by one that still runs)
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
                        log.warning("Removed %s, left by process %s that died writing a checkpoint.", tmp, pid)
            yield

    def check_outputs(self) -> None:
        """Before the run writes anything: RunDirError naming the first place it writes that cannot take it."""
        for folder in (self.dir / name for name in self.FOLDERS):
            if folder.exists() and not folder.is_dir():
                _cannot(folder, "it is a file, where the run keeps a folder")
            if folder.is_dir():
                self.check_writable(folder)
        for pattern in self.FILES:
            for path in sorted(self.dir.glob(pattern)):
                if path.is_dir() and not (path.parent.name == "eval" and path.name in ("tb", "export")):
                    _cannot(path, "it is a folder, where the run writes a file")

    def check_writable(self, folder: Optional[Path] = None) -> None:
        """RunDirError if `folder` refuses a file of one block: tried, as permission bits lie to root and on quotas."""
        folder = folder or self.dir
        path = folder / f".write-test-{os.getpid()}"
        try:  # buffered: a short write is retried, then raises (a file-size limit, a disk that filled meanwhile)
            with open(path, "xb") as file:
                file.write(bytes(4096))
                file.flush()
                os.fsync(file.fileno())
        except OSError as err:
            full = err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
            fix = "Free disk space (or raise the file-size limit)" if full else "Make it writable"
            _cannot(folder, f"this folder refuses a new file ({err.strerror})", fix)
        finally:
            with contextlib.suppress(OSError):  # (none was made)
                path.unlink()

    def keep_record(self, cfg: DictConfig, held: MemoryHandler) -> None:
        """.hydra/*.yaml and the log with its held lines, once the checks passed (Hydra's, at the job's start: off)."""
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
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))  # Hydra's
        held.setTarget(handler)
        held.flushLevel = logging.NOTSET  # from now on every line is written at once
        held.flush()

    def outputs(self) -> list[Path]:
        return [p for p in self.dir.iterdir() if p.name != self.LOCK] if self.dir.is_dir() else []

    def remove_if_empty(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # rmdir: only an empty folder; ValueError: another drive
            os.removedirs(os.path.relpath(self.dir))  # and the empty ones above, up to the launch folder alone


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
        held.close()  # writes what is still held to the file, if there is one (and forgets the file)
        if file is not None:
            file.close()


def _write_holder(fd: int) -> None:
    """filelock's on_acquired: this process's 'PID HOST' into the lock file, and a word about a holder that died."""
    os.lseek(fd, 0, os.SEEK_SET)
    if previous := os.read(fd, 200).decode(errors="replace").split()[:2]:
        log.warning("Took over the lock of process %s, which ended without releasing it.", " on host ".join(previous))
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())


def _cannot(path: Path, problem: str, fix: str = "Move it away") -> NoReturn:
    raise RunDirError(f"Cannot write {path}: {problem}. Nothing was written. {fix}, then run it again.") from None
