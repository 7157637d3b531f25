"""Optuna searches (hparams_search=optuna): what Hydra's Optuna sweeper does not check, each a traceback there."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from gan.launch import refuse, unwritable

log = logging.getLogger(__name__)


class SearchChecks(Callback):
    """Refuses a search that cannot run as asked; says where a study outside its sweep folder is kept."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweeper, sweep = config.hydra.sweeper, Path(config.hydra.sweep.dir).expanduser()
        if problem := settings_problem(sweeper) or storage_problem(sweeper.storage, sweep):
            refuse(f"{problem}. Nothing was written.")
        try:  # the study's file is kept there
            sweep.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            refuse(unwritable("hydra.sweep.dir", sweep, err))


def settings_problem(sweeper: DictConfig) -> str:
    """What is wrong with the sweeper's numbers and direction, or ''."""
    for key, what in (("n_trials", "trials to run"), ("n_jobs", "trials asked for at once")):
        if not sweeper[key] or sweeper[key] < 1:
            return f"hydra.sweeper.{key}={sweeper[key]}: the number of {what} must be 1 or more"
    if not 0 <= sweeper.max_failure_rate <= 1:
        return (
            f"hydra.sweeper.max_failure_rate={sweeper.max_failure_rate} must be from 0 to 1 (the share that may fail)"
        )
    if not sweeper.study_name and sweeper.storage:
        return f"hydra.sweeper.study_name={sweeper.study_name}: a stored study needs a name to be continued: give one"
    if sweeper.direction != "minimize":
        return f"hydra.sweeper.direction={sweeper.direction}: a trial returns its FID (lower is better): leave it out"
    return ""


def storage_problem(storage: Optional[str], sweep: Path) -> str:
    """What makes the study's SQLite file unusable, or ''; logs where a study outside `sweep` is kept."""
    if storage is None or not str(storage).startswith("sqlite:///"):
        log.warning(
            "The study is kept %s, outside the sweep folder %s.", f"at {storage}" if storage else "in memory", sweep
        )
        return ""
    file, said = Path(str(storage)[len("sqlite:///") :]).expanduser(), f"hydra.sweeper.storage={storage}"
    if not (inside := file.resolve().parent == sweep.resolve()):
        log.warning(
            "The study is stored in %s, outside the sweep folder %s: continue it with this storage.", file, sweep
        )
    if file.is_dir():
        return f"{said} names a folder, where the study is kept in a file: name a file"
    if not file.parent.is_dir():  # the sweep folder is made next, with the sweep's own checks
        return "" if inside else f"{said}: the folder {file.parent} does not exist: make it"
    if not os.access(file if file.exists() else file.parent, os.W_OK):
        return f"{said}: this user cannot write {file if file.exists() else file.parent}: give write permission there"
    try:
        if file.exists():
            with sqlite3.connect(f"file:{file}?mode=ro", uri=True) as db:
                db.execute("PRAGMA quick_check").fetchall()
    except sqlite3.Error as err:
        return f"{said}: {file} cannot be read as an SQLite database ({err}): move it away, or choose another"
    return ""
