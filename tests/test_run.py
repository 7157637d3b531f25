"""gan/run.py: a run folder's layout, its one owner at a time, and what a new run must not be written over."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time
from pathlib import Path

import pytest
from conftest import compose_config, run_train
from filelock import FileLock

from gan.errors import RunDirError
from gan.run import Run
from gan.training import train


def unused_pid() -> int:
    pid = 999_999
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    return pid


def test_the_layout_is_spelled_once():
    run = Run("r")
    assert (run.last, run.best) == (Path("r/checkpoints/last.pt"), Path("r/checkpoints/best.pt"))
    assert (run.tb, run.samples, run.eval, run.record) == tuple(
        Path("r") / n for n in ("tb", "samples", "eval", ".hydra")
    )
    assert Run.of_checkpoint(run.last).dir == Path("r") and Run.of_checkpoint(Path("loose.pt")) is None


def test_the_lock_excludes_a_second_holder_naming_the_first(tmp_path):
    run = Run(tmp_path)
    with run.owned():
        with pytest.raises(RunDirError, match=f"is in use: process {os.getpid()} on host "):
            with run.owned():
                pass
    assert not (tmp_path / Run.LOCK).exists()  # released and removed
    with run.owned():  # free again
        pass


def test_a_lock_that_is_a_folder_is_named_not_raised(tmp_path):
    (tmp_path / Run.LOCK).mkdir()
    with pytest.raises(RunDirError, match="it is a folder, where the run keeps its lock file. Nothing was written"):
        with Run(tmp_path).owned():
            pass


def test_a_lock_left_by_a_dead_process_is_taken_over_with_a_word(tmp_path, caplog):
    (tmp_path / Run.LOCK).write_text(f"{unused_pid()} testhost\n")  # no flock: its holder is gone
    with Run(tmp_path).owned():
        assert (tmp_path / Run.LOCK).read_text().split()[0] == str(os.getpid())
    assert "on host testhost, which ended without releasing it" in caplog.text


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the held lock's file was closed
def test_a_forked_child_does_not_keep_the_run_dir_locked(tmp_path):
    # DataLoader workers are forked while the lock is held; after a kill -9 of the main process they live on
    # for a few seconds, and must not keep a resume out meanwhile (filelock closes its descriptor in a child).
    fork = multiprocessing.get_context("fork")
    started = fork.Event()
    held = Run(tmp_path).owned()
    held.__enter__()
    child = fork.Process(target=lambda: (started.set(), time.sleep(60)))
    child.start()
    try:
        assert started.wait(30)
        for fd in os.listdir("/proc/self/fd"):  # what the kernel does to a killed process's files
            if os.path.realpath(f"/proc/self/fd/{fd}") == str((tmp_path / Run.LOCK).resolve()):
                os.close(int(fd))
        FileLock(tmp_path / Run.LOCK, timeout=0).acquire()  # free at once, though the child still runs
    finally:
        child.kill()
        child.join()


def test_stale_temp_files_go_and_live_ones_stay(tmp_path):
    run = Run(tmp_path)
    run.checkpoints.mkdir()
    dead, live = run.checkpoints / f".last.pt.{unused_pid()}.tmp", run.checkpoints / f".last.pt.{os.getpid()}.tmp"
    for path in (dead, live, run.last):
        path.write_bytes(b"x" * 100)
    run.remove_stale_temp_files()
    assert sorted(p.name for p in run.checkpoints.iterdir()) == sorted([live.name, "last.pt"])


@pytest.mark.parametrize(
    ("made", "said"),
    [
        ("checkpoints/last.pt", "already holds a run (checkpoints/last.pt)"),
        (".hydra/overrides.yaml", "already holds a run that wrote no checkpoint"),
    ],
)
def test_a_new_run_is_refused_where_a_run_is_or_inside_one(tmp_path, made, said):
    (tmp_path / made).parent.mkdir(parents=True)
    (tmp_path / made).write_text("x")
    assert said in Run(tmp_path).existing_run()
    assert "lies inside the folder of another run" in Run(tmp_path / "deeper" / "run").existing_run()
    assert Run(tmp_path.parent / f"{tmp_path.name}-elsewhere").existing_run() is None


def test_a_resume_into_another_runs_folder_is_refused(tiny_run, tmp_path):
    other = Path(shutil.copytree(tiny_run, tmp_path / "other"))
    assert "which holds another run" in Run(other).foreign_run(Run(tiny_run).last)
    assert Run(tiny_run).foreign_run(Run(tiny_run).last) is None  # its own folder


@pytest.mark.parametrize(
    ("blocker", "said"),
    [
        ("samples", "it is a file, where the run keeps a folder of its sample grids"),
        ("checkpoints/last.pt/", "it is a folder, where the run writes a file"),
    ],  # fmt: skip
)
def test_a_place_the_run_writes_that_cannot_take_it_is_named_before_any_write(tmp_path, blocker, said):
    path = tmp_path / blocker.rstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir() if blocker.endswith("/") else path.write_text("x")
    with pytest.raises(RunDirError, match=said):
        Run(tmp_path).check_outputs()


def test_train_refuses_a_new_run_over_a_finished_one(tmp_path):
    train(compose_config("trainer.max_steps=1"), tmp_path)
    before = Run(tmp_path).last.read_bytes()
    with pytest.raises(RunDirError, match="already holds a run"):
        train(compose_config("trainer.max_steps=1", "loss=hinge"), tmp_path)
    assert Run(tmp_path).last.read_bytes() == before and not (tmp_path / Run.LOCK).exists()


def test_a_run_dir_in_use_is_refused_by_the_command_naming_the_holder(tiny_run, tmp_path):
    run_dir = Path(shutil.copytree(tiny_run, tmp_path / "run"))
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with Run(run_dir).owned():
        result = run_train(f"trainer.resume={run_dir}", "trainer.max_steps=8", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and f"The run directory {run_dir} is in use: process {os.getpid()}" in output
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
