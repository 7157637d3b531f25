"""A refused command leaves every existing run as it was; what a stopped run says works when pasted.

Hydra writes a job's .hydra/ record and opens its log file as the job starts, before train.py has
checked anything; train.py switches both off and writes them itself once every check has passed
(gan/run.py, gan/launch.py). These tests make real commands fail in the ways a user does, and compare
every file of every run before and after.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY, run_train
from hydra.core.override_parser.overrides_parser import OverridesParser

from gan.checkpoint import load_checkpoint
from gan.launch import hydra_quote as _hydra_quote
from gan.launch import resume_override, unquote

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}


def snapshot(*folders: Path) -> dict[str, str]:
    """Every file under the folders (hidden ones too), by path -> sha256 of its bytes."""
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for folder in folders
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def output_of(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two finished 3-step runs, A and B (tests copy them before writing)."""
    base = tmp_path_factory.mktemp("runs")
    for name in ("A", "B"):
        result = run_train("trainer.max_steps=3", f"hydra.run.dir={base / name}", cwd=base)
        assert result.returncode == 0, output_of(result)[-3000:]
    return base / "A", base / "B"


@pytest.fixture
def runs(two_runs, tmp_path) -> tuple[Path, Path]:
    return shutil.copytree(two_runs[0], tmp_path / "A"), shutil.copytree(two_runs[1], tmp_path / "B")


@pytest.mark.parametrize(
    "bad, key",
    [
        ("optim.lr=-1", "optim.lr"),
        ("trainer.threads=-1", "trainer.threads"),
        ("trainer.device=cuda:7", "trainer.device"),
    ],
)
def test_a_refused_resume_leaves_the_run_as_it_was_and_its_plain_resume_works(runs, tmp_path, bad, key):
    run_a, _ = runs
    before = snapshot(run_a)
    refused = run_train(f"trainer.resume={run_a}", "trainer.max_steps=5", bad, cwd=tmp_path)
    assert refused.returncode == 2, output_of(refused)[-3000:]
    assert key in output_of(refused) and "Traceback" not in output_of(refused)
    assert snapshot(run_a) == before  # the bad value reached no file: .hydra/overrides.yaml included
    assert not any((tmp_path / "outputs").rglob("*"))  # and no folder of its own is left either
    plain = run_train(f"trainer.resume={run_a}", "trainer.max_steps=5", cwd=tmp_path)
    assert plain.returncode == 0, output_of(plain)[-3000:]
    assert load_checkpoint(run_a)["step"] == 5


def test_a_resume_into_another_runs_folder_is_refused(runs, tmp_path):
    run_a, run_b = runs
    before = snapshot(run_a, run_b)
    result = run_train(f"trainer.resume={run_a}", f"hydra.run.dir={run_b}", "trainer.max_steps=5", cwd=tmp_path)
    assert result.returncode == 2, output_of(result)[-3000:]
    assert str(run_b) in output_of(result) and "holds another run" in output_of(result)
    assert snapshot(run_a, run_b) == before
    # into a new folder it is a continuation of A there; A itself stays as it was
    fresh = tmp_path / "continued"
    result = run_train(f"trainer.resume={run_a}", f"hydra.run.dir={fresh}", "trainer.max_steps=5", cwd=tmp_path)
    assert result.returncode == 0, output_of(result)[-3000:]
    assert load_checkpoint(fresh)["step"] == 5 and snapshot(run_a, run_b) == before


@pytest.mark.slow  # two processes at once: a second command while the first trains
def test_a_new_run_over_a_run_in_progress_changes_nothing_and_its_resume_still_works(tmp_path):
    run_dir = tmp_path / "busy"
    args = [sys.executable, str(ROOT / "train.py"), *TINY, f"hydra.run.dir={run_dir}"]
    # a run that takes long to reach its first checkpoint: the window the record used to be lost in
    first = subprocess.Popen(
        [*args, "trainer.max_steps=100000", "trainer.checkpoint_every=100000", "trainer.sample_every=100000"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
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


def test_a_run_writes_its_record_and_a_complete_log_once_its_checks_passed(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("trainer.max_steps=2", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, output_of(result)[-3000:]
    overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    assert "trainer.max_steps=2" in overrides and (run_dir / ".hydra" / "config.yaml").is_file()
    assert yaml.safe_load((run_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]["run"]["dir"] == str(run_dir)
    log = (run_dir / "train.log").read_text()
    # lines logged before the record was written (the data is read during the checks) are in the file
    assert "training split" in log and "Done: 2 steps" in log


def test_a_refused_new_run_leaves_no_folder(tmp_path):
    result = run_train("optim.lr_d=-1", cwd=tmp_path)
    assert result.returncode == 2 and "optim.lr_d" in output_of(result)
    assert [p for p in (tmp_path / "outputs").rglob("*")] == []


def test_a_run_whose_record_is_missing_resumes_with_the_settings_in_its_checkpoint(runs, tmp_path):
    run_a, _ = runs
    shutil.rmtree(run_a / ".hydra")
    result = run_train(f"trainer.resume={run_a}", "trainer.max_steps=5", "trainer.threads=1", cwd=tmp_path, tiny=False)
    assert result.returncode == 0, output_of(result)[-3000:]
    state = load_checkpoint(run_a)
    assert state["step"] == 5 and state["config"]["model"]["g_width"] == 8  # debug=tiny's, not the default
    # a checkpoint outside any run directory, with no settings on the command line: the same
    loose = tmp_path / "loose.pt"
    shutil.copy(run_a / "checkpoints" / "last.pt", loose)
    result = run_train(f"trainer.resume={loose}", "trainer.max_steps=7", cwd=tmp_path, tiny=False)
    assert result.returncode == 0, output_of(result)[-3000:]
    assert [load_checkpoint(p)["step"] for p in (tmp_path / "outputs").rglob("last.pt")] == [7]


def test_a_resume_keeps_each_setting_its_checkpoint_holds_and_refuses_a_change_by_name(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("trainer.max_steps=2", "model.ema_decay=0.99", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, output_of(result)[-3000:]
    # the resume's command line does not say it: the checkpoint does
    result = run_train(f"trainer.resume={run_dir}", "trainer.max_steps=4", cwd=tmp_path)
    assert result.returncode == 0, output_of(result)[-3000:]
    assert load_checkpoint(run_dir)["config"]["model"]["ema_decay"] == 0.99
    # a change the command asks for is still refused, by name
    result = run_train(f"trainer.resume={run_dir}", "trainer.max_steps=6", "model.ema_decay=0.9", cwd=tmp_path)
    assert result.returncode == 2 and "model.ema_decay" in output_of(result)


def test_a_sweep_with_resume_auto_continues_each_jobs_own_run(tmp_path):
    sweep = tmp_path / "sweep"
    common = ("-m", "optim.lr=1e-3,2e-3", f"hydra.sweep.dir={sweep}")
    first = run_train(*common, "trainer.max_steps=2", cwd=tmp_path)
    assert first.returncode == 0, output_of(first)[-3000:]
    jobs = sorted(p.parent.parent for p in sweep.rglob("last.pt"))
    assert len(jobs) == 2
    before = snapshot(sweep)
    again = run_train(*common, "trainer.max_steps=2", cwd=tmp_path)  # the same sweep, into the same folder
    assert again.returncode == 2 and "hydra.sweep.dir" in output_of(again) and snapshot(sweep) == before
    resumed = run_train(*common, "trainer.max_steps=4", "trainer.resume=auto", cwd=tmp_path)
    assert resumed.returncode == 0, output_of(resumed)[-3000:]
    assert "Checkpoint not found" not in output_of(resumed)
    assert [load_checkpoint(job)["step"] for job in jobs] == [4, 4]
    assert [load_checkpoint(job)["config"]["optim"]["lr"] for job in jobs] == [1e-3, 2e-3]


@pytest.mark.slow  # a signal to a real process, and the line it prints pasted into a shell
@pytest.mark.parametrize("name", ["with space", "lr=1e-3,seed=2", "it's"])
def test_the_resume_line_a_stopped_run_prints_works_when_pasted(tmp_path, name):
    run_dir = tmp_path / name / "run"
    args = [
        sys.executable,
        str(ROOT / "train.py"),
        *TINY,
        f"hydra.run.dir={_hydra_quote(run_dir)}",
    ]
    process = subprocess.Popen(
        [*args, "trainer.max_steps=100000", "trainer.checkpoint_every=100000"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    for line in process.stdout:  # training is under way (its signal handlers set) once a step is logged
        seen.append(line)
        if "time/first_step_s" in line:
            break
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=120)
    out = "".join(seen) + out
    assert process.returncode == 143, out[-3000:]
    line = out.split("Resume with:\n", 1)[1].splitlines()[0].strip()
    step = load_checkpoint(run_dir)["step"]
    assert line.startswith("python train.py ")
    pasted = line.replace("python train.py", f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'train.py'))}", 1)
    result = subprocess.run(
        ["bash", "-c", f"{pasted} trainer.max_steps={step + 1}"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, output_of(result)[-3000:]
    assert load_checkpoint(run_dir)["step"] == step + 1


@pytest.mark.parametrize(
    "path", ["/a b/c", "/x=1,y=2/r", "/it's/r", "/back\\slash/r", "/end\\", '/q"x', "/a'b\\'c", "/plain"]
)
def test_paths_are_quoted_for_hydra_and_the_shell(path):
    quoted = _hydra_quote(path)
    assert OverridesParser.create().parse_override(f"trainer.resume={quoted}").value() == path
    assert unquote(quoted) == path
    echoed = subprocess.run(["bash", "-c", f"printf %s {resume_override(Path(path))}"], capture_output=True, text=True)
    assert OverridesParser.create().parse_override(echoed.stdout).value() == path


@pytest.mark.slow  # a process whose file-size limit is 1,000 bytes: the disk it sees is full
@pytest.mark.parametrize("program", ["train.py", "evaluate.py"])
def test_a_disk_that_refuses_every_write_is_reported_before_anything_is_written(tmp_path, program, runs):
    def no_file_may_grow():  # what a full disk does to a write; SIGXFSZ would kill the process instead
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # Python starts; no block of data

    settings = TINY if program == "train.py" else [f"checkpoint={runs[0]}", "threads=1"]
    result = subprocess.run(
        [sys.executable, str(ROOT / program), *settings],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=no_file_may_grow,
    )
    assert result.returncode == 2, output_of(result)[-3000:]
    output = output_of(result)
    assert "refuses a new file (File too large)" in output and "Free disk space" in output, output[-3000:]
    assert "Traceback" not in output and not (tmp_path / "outputs").exists()


def test_a_new_run_inside_another_runs_folder_is_refused(runs, tmp_path):
    run_a, _ = runs
    before = snapshot(run_a)
    for inside in (run_a / "checkpoints", run_a / "more" / "deeply"):
        result = run_train(f"hydra.run.dir={inside}", cwd=tmp_path)
        assert result.returncode == 2, output_of(result)[-3000:]
        assert f"inside the folder of another run, {run_a}" in output_of(result)
        assert snapshot(run_a) == before


def test_a_path_hydra_cannot_read_is_named_with_the_quoting_that_works(runs, tmp_path):
    job = tmp_path / "0_optim.lr=0.002"  # how a sweep names its job folders
    shutil.copytree(runs[0], job)
    result = run_train(f"trainer.resume={job}", "trainer.max_steps=4", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in output_of(result)
    message = output_of(result)
    assert f"trainer.resume={job}" in message and "mismatched input" not in message
    suggestion = message.split("inside the shell's quotes: ", 1)[1].split()[0]
    pasted = subprocess.run(["bash", "-c", f"printf %s {suggestion}"], capture_output=True, text=True).stdout
    result = run_train(pasted, "trainer.max_steps=4", cwd=tmp_path)
    assert result.returncode == 0, output_of(result)[-3000:]
    assert load_checkpoint(job)["step"] == 4


def test_the_record_of_a_resume_that_named_only_its_own_settings_agrees_with_its_checkpoint(tmp_path):
    # a resume's overrides.yaml holds its command (debug=tiny, trainer.resume, max_steps), not loss=hinge: the
    # next resume compares only what those overrides set, so the run's hinge loss is no disagreement
    run_dir = tmp_path / "run"
    first = run_train("loss=hinge", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert first.returncode == 0, output_of(first)[-3000:]
    for steps in (8, 10):
        resume = (f"trainer.resume={run_dir}", f"trainer.max_steps={steps}")
        resumed = run_train(*resume, cwd=tmp_path)
        assert resumed.returncode == 0, output_of(resumed)[-3000:]
    assert "loss=hinge" not in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert load_checkpoint(run_dir)["step"] == 10 and load_checkpoint(run_dir)["config"]["loss"]["name"] == "hinge"
