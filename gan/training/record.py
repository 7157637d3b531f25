"""A run's record of itself, written only once every check has passed.

Owns the rule that a refused command leaves every existing run as it was. Hydra, left to itself,
writes a job's record (`.hydra/config.yaml`, `hydra.yaml`, `overrides.yaml`: the command line a
resume replays) and opens its log file (`train.log`, appended to) as the job starts, before the
application has checked anything. A command that was then refused (a bad value on a resume, a
second run pointed at a run in use, a resume into another run's folder) had already replaced the
record of the run it named. So configs/train.yaml and configs/evaluate.yaml switch both off
(`hydra.output_subdir: null`, `hydra/job_logging: console`), and the entry points write the same
files here, with Hydra's own content, once train() or evaluate() says every check has passed.
What is logged before that is held in memory and goes into the log file first, so the file is
complete; a refused command writes no file at all, and the empty folder Hydra made for it is
removed. The rule holds for every way a run directory is named (hydra.run.dir, the interpolated
default, a sweep's job folders), because it does not depend on the name.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Iterator

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from gan.training.rundir import RECORD

LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's job_logging format


def write_record(run_dir: Path, cfg: DictConfig) -> None:
    """RUN_DIR/.hydra/{config,hydra,overrides}.yaml as Hydra writes them (the job's config without
    its hydra node, the hydra node, the command line's overrides), each file replaced atomically:
    a resume's record is rewritten with the command that continued it, never half."""
    hydra = HydraConfig.instance().cfg  # {"hydra": ...}, as Hydra saves it
    folder = run_dir / RECORD
    folder.mkdir(parents=True, exist_ok=True)
    for name, node in (("config.yaml", cfg), ("hydra.yaml", hydra), ("overrides.yaml", hydra.hydra.overrides.task)):
        path = folder / name
        partial = path.with_name(f".{name}.{os.getpid()}.tmp")
        partial.write_text(OmegaConf.to_yaml(node), encoding="utf-8")
        os.replace(partial, path)


class HeldLog(logging.Handler):
    """The job's log lines, held in memory until the run's log file may be written (`open`), then
    written there first and every later line with them; never written if the command is refused.

    One handler on the root logger from start to end (tqdm's logging_redirect_tqdm restores the
    handler list it found, so a handler swapped in meanwhile would be lost). Console output is
    Hydra's (configs/hydra/job_logging/console.yaml); this adds only the file.
    """

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(LOG_FORMAT))
        self.held: list[logging.LogRecord] = []
        self.file: logging.FileHandler | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.file is None:
            self.held.append(record)
        else:
            self.file.emit(record)

    def open(self, path: Path) -> None:
        """Append to `path` from now on, after the lines held so far."""
        self.file = logging.FileHandler(path, encoding="utf-8")
        self.file.setFormatter(self.formatter)
        for record in self.held:
            self.file.emit(record)
        self.held.clear()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.held.clear()  # a refused command: the held lines go nowhere
        super().close()


@contextlib.contextmanager
def held_log() -> Iterator[HeldLog]:
    log = HeldLog()
    root = logging.getLogger()
    root.addHandler(log)
    try:
        yield log
    finally:
        root.removeHandler(log)
        log.close()


def remove_if_empty(run_dir: Path) -> None:
    """The folder Hydra made for a refused command, if it holds nothing, and the folders above it
    that then hold nothing (outputs/DATE/ of the default name), up to outputs/ or the working
    directory: a refusal leaves no trace. A folder with anything in it is left as it is."""
    folder, stop = run_dir.absolute(), Path.cwd().absolute()
    while folder != stop and folder.name != "outputs" and folder != folder.parent:
        try:
            folder.rmdir()  # only an empty folder: anything else raises, and is left as it is
        except OSError:
            return
        folder = folder.parent
