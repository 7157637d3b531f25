"""Optuna searches (hparams_search=optuna): what Hydra's Optuna sweeper does not check (a setting at its edge, a
damaged storage file, each a traceback there), as a Hydra callback; a refusal is one paragraph and exit code 2."""

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
SQLITE = "sqlite:///"


class SearchChecks(Callback):
    """Refuses a search that cannot run as asked; says where a study outside its sweep folder is kept."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweeper, sweep = config.hydra.sweeper, Path(config.hydra.sweep.dir).expanduser()
        for problem in (settings_problem(sweeper), storage_problem(sweeper.storage, sweep)):
            if problem:
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
            f"hydra.sweeper.max_failure_rate={sweeper.max_failure_rate}: the share of a batch of trials that may fail "
            "must be from 0 (stop at the first failure) to 1 (never stop)"
        )
    if not sweeper.study_name and sweeper.storage:
        return (
            f"hydra.sweeper.study_name={sweeper.study_name}: Optuna would name the study at random, so no later launch "
            "could continue it: give it a name, or leave the setting out"
        )
    if sweeper.direction != "minimize":
        return (
            f"hydra.sweeper.direction={sweeper.direction}: each trial returns its final FID, where lower is better, "
            "so the search minimizes it: leave hydra.sweeper.direction out"
        )
    return ""


def storage_problem(storage: Optional[str], sweep: Path) -> str:
    """What makes the study's SQLite file unusable, or ''; logs where a study outside `sweep` is kept."""
    if storage is None:
        log.warning("hydra.sweeper.storage=null: the study is kept in memory only; no launch can continue it.")
        return ""
    if not str(storage).startswith(SQLITE):
        log.warning("The study is stored at %s, outside the sweep folder %s.", storage, sweep)
        return ""
    file = Path(str(storage)[len(SQLITE) :]).expanduser()
    if not (inside := file.resolve().parent == sweep.resolve()):
        log.warning(
            "The study is stored in %s, outside the sweep folder %s: continue it with this storage.", file, sweep
        )
    said = f"hydra.sweeper.storage={storage}"
    if file.is_dir():
        return f"{said} names a folder, where the study is kept in a file: name a file, or leave the setting out"
    if not file.parent.is_dir():  # the sweep folder is made next, with the sweep's own checks
        return "" if inside else f"{said}: the folder {file.parent} does not exist: make it, or leave the setting out"
    if not os.access(file if file.exists() else file.parent, os.W_OK):
        return f"{said}: this user cannot write {file if file.exists() else file.parent}: give write permission there"
    if file.exists():
        try:
            with sqlite3.connect(f"file:{file}?mode=ro", uri=True) as db:
                db.execute("PRAGMA quick_check").fetchall()
        except sqlite3.Error as err:
            return (
                f"{said}: {file} cannot be read as an SQLite database ({err}), so it is not a study this search "
                "can continue. Move it away to start a new study there, or choose another hydra.sweep.dir"
            )
    return ""
