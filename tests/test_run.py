"""gan/run.py: a run folder's layout, its one owner at a time, and what a new run must not be written over."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY, output_of, run_train, snapshot
from filelock import FileLock
from test_launch import ENV

from gan.checkpoint import load_checkpoint
from gan.errors import RunDirError
from gan.run import Run


def unused_pid() -> int:
    return next(pid for pid in range(999_999, 0, -1) if not Path(f"/proc/{pid}").exists())


def test_the_lock_names_its_holder_is_taken_over_from_a_dead_one_and_is_named_when_a_folder(tmp_path, caplog):
    run, lock = Run(tmp_path), tmp_path / Run.LOCK
    with run.owned():
        pytest.raises(RunDirError, run.owned().__enter__).match(f"is in use: process {os.getpid()} on host ")
    assert not lock.exists()  # released and removed
    lock.write_text(f"{unused_pid()} testhost\n")  # no flock: its holder is gone
    with run.owned():
        assert lock.read_text().split()[0] == str(os.getpid())
    assert "on host testhost, which ended without releasing it" in caplog.text
    lock.mkdir()  # named, not raised
    with pytest.raises(RunDirError, match=f"{lock}: it is a folder.*Nothing was written. Move it away"):
        run.owned().__enter__()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the held lock's file was closed
def test_a_forked_child_does_not_keep_the_run_dir_locked(tmp_path):
    # DataLoader workers are forked while the lock is held; after a kill -9 of the main process they live on
    # for a few seconds, and must not keep a resume out meanwhile (filelock closes its descriptor in a child).
    fork = multiprocessing.get_context("fork")
    started, held = fork.Event(), Run(tmp_path).owned()
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
    with run.owned_for_training(resuming=run.last):  # its own run: continued, not refused
        pass
    assert sorted(p.name for p in run.checkpoints.iterdir()) == sorted([live.name, "last.pt"])


def test_a_resume_into_another_runs_folder_is_refused_by_the_command(tiny_run, tmp_path):
    run_a, run_b = (shutil.copytree(tiny_run, tmp_path / name) for name in "AB")
    before = snapshot(run_a, run_b)
    result = run_train(f"trainer.resume={run_a}", f"hydra.run.dir={run_b}", "trainer.max_steps=8", cwd=tmp_path)
    assert result.returncode == 2 and f"in {run_b}, which holds another run" in output_of(result), output_of(result)
    assert "Drop hydra.run.dir" in output_of(result) and snapshot(run_a, run_b) == before
    # into a new folder it is a continuation of A there; A itself stays as it was
    fresh = tmp_path / "continued"
    result = run_train(f"trainer.resume={run_a}", f"hydra.run.dir={fresh}", "trainer.max_steps=8", cwd=tmp_path)
    assert result.returncode == 0, output_of(result)[-3000:]
    assert load_checkpoint(fresh)["step"] == 8 and snapshot(run_a, run_b) == before


@pytest.mark.slow  # two processes at once: a second command while the first trains
def test_a_new_run_over_a_run_in_progress_changes_nothing_and_its_resume_still_works(tmp_path):
    run_dir = tmp_path / "busy"
    args = [sys.executable, str(ROOT / "train.py"), *TINY, f"hydra.run.dir={run_dir}"]
    # a run that takes long to reach its first checkpoint: the window the record used to be lost in
    args += ["trainer.max_steps=100000", "trainer.checkpoint_every=100000", "trainer.sample_every=100000"]
    first = subprocess.Popen(args, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / ".hydra" / "overrides.yaml").is_file():
            assert first.poll() is None and time.monotonic() < deadline, "the first run never started"
            time.sleep(0.2)
        time.sleep(0.5)
        record = snapshot(run_dir / ".hydra")
        second = run_train(f"hydra.run.dir={run_dir}", "loss=hinge", cwd=tmp_path)
        assert second.returncode == 2, output_of(second)[-3000:]
        assert "in use" in output_of(second) or "already holds a run" in output_of(second)
        assert snapshot(run_dir / ".hydra") == record
    finally:
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=120)
    assert first.returncode == 143, out[-3000:]
    step = load_checkpoint(run_dir)["step"]
    resumed = run_train(f"trainer.resume={run_dir}", f"trainer.max_steps={step + 2}", cwd=tmp_path)
    assert resumed.returncode == 0, output_of(resumed)[-3000:]
    assert load_checkpoint(run_dir)["step"] == step + 2


def test_a_run_writes_its_record_and_a_complete_log_once_its_checks_passed(tiny_run):
    overrides = yaml.safe_load((tiny_run / ".hydra" / "overrides.yaml").read_text())
    assert "debug=tiny" in overrides and (tiny_run / ".hydra" / "config.yaml").is_file()
    assert yaml.safe_load((tiny_run / ".hydra" / "hydra.yaml").read_text())["hydra"]["run"]["dir"] == str(tiny_run)
    log = (tiny_run / "train.log").read_text()
    # lines logged before the record was written (the data is read during the checks) are in the file
    assert "training split" in log and "Done: 6 steps" in log
    # and what a real run writes (config.yaml's debug=tiny is the tests' own)
    assert (tiny_run / "checkpoints" / "last.pt").is_file() and list((tiny_run / "samples").glob("*.png"))
    assert list((tiny_run / "tb").glob("events.out.tfevents.*"))


@pytest.mark.slow  # a process whose file-size limit is 1,000 bytes: the disk it sees is full
@pytest.mark.parametrize("program", ["train.py", "evaluate.py"])
def test_a_disk_that_refuses_every_write_is_reported_before_anything_is_written(tmp_path, program, tiny_run):
    def no_file_may_grow():  # what a full disk does to a write; SIGXFSZ would kill the process instead
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # Python starts; no block of data

    settings = TINY if program == "train.py" else [f"checkpoint={tiny_run}", "threads=1"]
    limited = dict(cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=240, preexec_fn=no_file_may_grow)
    result = subprocess.run([sys.executable, str(ROOT / program), *settings], **limited)
    assert result.returncode == 2, output_of(result)[-3000:]
    output = output_of(result)
    assert "refuses a new file (File too large)" in output and "Free disk space" in output, output[-3000:]
    assert "Traceback" not in output and not (tmp_path / "outputs").exists()


HOLDS = "{run} already holds a run"
BY_COMMAND = {  # where the run lies ("busy": held by this process), the command ({run}, {tmp}), what is said
    "in use": ("busy", ["trainer.resume={run}", "trainer.max_steps=8"], "{run} is in use: process {pid}"),
    "inside its checkpoints/": ("A", ["hydra.run.dir={run}/checkpoints"], "inside the folder of another run, {run}"),
    "deeper inside": ("A", ["hydra.run.dir={run}/more/deeply"], "inside the folder of another run, {run}"),
    "a run with no checkpoint": ("R", ["hydra.run.dir={run}"], "{run} already holds a run's .hydra/ record"),
    "through an interpolation": ("runs/i_7", ["trainer.seed=7", "hydra.run.dir={tmp}/runs/i_${{trainer.seed}}"], HOLDS),
    "quoted: a sweep job's name, moved": ("my runs/0_optim.lr=0.002", ["hydra.run.dir='{run}'"], HOLDS),
    "dot-dot": ("runs/a", ["hydra.run.dir={run}/../a"], HOLDS),  # Hydra's absolute path
    "relative": ("runs/a", ["hydra.run.dir=runs/a"], HOLDS),
    "through a symlink": ("runs/a", ["hydra.run.dir={tmp}/link"], "{tmp}/link already holds a run"),
}


@pytest.mark.parametrize(("where", "argv", "said"), BY_COMMAND.values(), ids=BY_COMMAND)
def test_a_command_into_a_run_inside_one_or_in_use_is_refused_however_named(tiny_run, tmp_path, where, argv, said):
    run_dir = shutil.copytree(tiny_run, tmp_path / where)
    if where == "R":  # its record only: the run wrote no checkpoint
        shutil.rmtree(run_dir / "checkpoints")
    (tmp_path / "link").symlink_to(run_dir, target_is_directory=True)
    before = snapshot(run_dir)
    with Run(run_dir).owned() if where == "busy" else contextlib.nullcontext():
        result = run_train(*(arg.format(run=run_dir, tmp=tmp_path) for arg in argv), cwd=tmp_path)
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert said.format(run=run_dir, tmp=tmp_path, pid=os.getpid()) in output and "Nothing was written" in output
    assert snapshot(run_dir) == before  # its lock came and went; nothing else


# a folder of the run's (ending in /) made a file, or a file it writes (a grid to come, among them) made a folder;
# "full PREFIX": the disk is full for the files written there; "": the first update is not finite (optim.lr=1e39,
# tunable on resume), caught at the first log, before any event, grid or checkpoint, and before the record
FOLDER, FILE = "it is a file, where the run keeps a folder", "it is a folder, where the run writes"
CANNOT_WRITE = {  # where -> the exit code, what is said ({path}: the run's path `where`, {run}: the run)
    **{where: (2, f"Cannot write {{path}}: {FOLDER}") for where in ("samples/", "tb/", "eval/")},
    **{where: (2, f"Cannot write {{path}}: {FILE}") for where in ("samples/step_000008.png", "checkpoints/best.pt")},
    **{where: (2, f"Cannot write {{path}}: {FILE}") for where in (".hydra/config.yaml", "train.log")},
    "full .hydra/.config.yaml.": (2, "No space left on device (errno 28). Free disk space, then resume: "),
    "full samples/.write-test-": (2, "samples: this folder refuses a new file (No space left on device)"),
    "": (3, "Non-finite"),
}


@pytest.mark.parametrize(("where", "code", "said"), [(k, *v) for k, v in CANNOT_WRITE.items()], ids=CANNOT_WRITE)
def test_a_failed_resume_leaves_its_run_as_it_was(tiny_run, tmp_path, monkeypatch, where, code, said):
    # the record, log, events, grids and checkpoint as they were, no temporary file, no folder of its own
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    path, fsync, full = run_dir / where, os.fsync, where.removeprefix("full ")

    def no_room_there(fd: int) -> None:  # the blocks of a file written there find no room
        if f"/{full}" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        fsync(fd)

    if where.startswith("full "):
        monkeypatch.setattr(os, "fsync", no_room_there)
    elif where:
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        path.write_text("not a folder\n") if where.endswith("/") else path.mkdir()
    before = snapshot(run_dir)
    rates = [] if where else ["optim.lr=1e39", "optim.lr_d=1e39"]
    output = output_of(result := run_train(f"trainer.resume={run_dir}", "trainer.max_steps=8", *rates, cwd=tmp_path))
    assert result.returncode == code and said.format(path=path) in output and "Traceback" not in output, output
    assert code == 3 or "Nothing was written" in output or where.startswith("full ")
    assert ("Free disk space" in output) == where.startswith("full ")
    if where == "full .hydra/.config.yaml.":
        assert f"{run_dir / 'checkpoints' / 'last.pt'} holds step 6" in output
    assert snapshot(run_dir) == before and sorted(p.name for p in tmp_path.iterdir()) == ["run"]
