"""The resume contract: what `trainer.resume=RUN` may change, what it refuses, and that a refusal
touches nothing on disk (the real CLI in a subprocess, tiny configs)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import yaml
from conftest import run_train

from gan.checkpoint import load_checkpoint
from gan.launch import unquote
from gan.training.state import lr_scale


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(run_dir: Path) -> dict[str, str]:
    """Every file of a run directory (TensorBoard aside) -> its hash."""
    return {
        str(p.relative_to(run_dir)): digest(p)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and "tb" not in p.parts
    }


def copy_run(run_dir: Path, to: Path) -> Path:
    for path in run_dir.rglob("*"):
        if path.is_file():
            (to / path.relative_to(run_dir)).parent.mkdir(parents=True, exist_ok=True)
            (to / path.relative_to(run_dir)).write_bytes(path.read_bytes())
    return to


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("resume") / "run"
    result = run_train("trainer.max_steps=4", "model.g_width=8", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.mark.parametrize(
    "change, named",
    [
        ("loss=hinge", "loss.name: 'bce' -> 'hinge'"),
        ("data.image_size=32", "data.image_size: 16 -> 32"),
        ("optim.beta1=0.9", "optim.beta1: 0.0 -> 0.9"),
        ("trainer.seed=1", "trainer.seed: 0 -> 1"),
    ],
)
def test_a_resume_that_changes_the_run_is_refused_before_anything_is_written(finished_run, change, named):
    before = snapshot(finished_run)
    result = run_train(f"trainer.resume={finished_run}", "trainer.max_steps=6", change)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output
    assert named in output and "Nothing was written" in output
    assert snapshot(finished_run) == before  # .hydra/overrides.yaml and config.yaml included


def test_the_refused_run_still_resumes_with_the_documented_command(finished_run, tmp_path):
    copy = copy_run(finished_run, tmp_path / "run")
    assert run_train(f"trainer.resume={copy}", "data.image_size=32").returncode == 2
    result = run_train(f"trainer.resume={copy}", "trainer.max_steps=6")
    assert result.returncode == 0, result.stderr[-3000:]
    assert load_checkpoint(copy)["step"] == 6


def test_a_new_learning_rate_takes_effect_and_is_recorded(finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path / "run")  # at step 4
    result = run_train(
        f"trainer.resume={run_dir}", "trainer.max_steps=6", "optim.lr=1e-5", "optim.lr_d=3e-5", "optim.lr_decay=0.5"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    state = load_checkpoint(run_dir)
    assert state["step"] == 6
    # the rates of the last update: the new ones times the (new) decay's scale at step 5 of 6
    scale = lr_scale(5, 6, 0.5)
    assert scale == pytest.approx(1 / 3) and state["config"]["optim"]["lr_decay"] == 0.5
    assert [g["lr"] for g in state["opt_g"]["param_groups"]] == [pytest.approx(1e-5 * scale)]
    assert [g["lr"] for g in state["opt_d"]["param_groups"]] == [pytest.approx(3e-5 * scale)]
    assert state["config"]["optim"]["lr"] == 1e-5
    # the record is the run's config as it now runs (the checkpoint's, with the new rates) and this command
    recorded = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert recorded["optim"]["lr"] == 1e-5 and recorded["model"]["g_width"] == 8
    assert "optim.lr=1e-5" in yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())


def test_max_steps_below_the_checkpoint_is_refused(finished_run):
    before = snapshot(finished_run)
    result = run_train(f"trainer.resume={finished_run}", "trainer.max_steps=2")
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output
    assert "trainer.max_steps=2 is below the step of the checkpoint being resumed (4)" in output
    assert snapshot(finished_run) == before


@pytest.mark.parametrize("quote", ["'", '"'])
def test_a_quoted_run_dir_is_resumed_like_a_bare_one(finished_run, tmp_path, quote):
    run_dir = copy_run(finished_run, tmp_path / "my run")  # a space: the path must be quoted for Hydra
    result = run_train(f"trainer.resume={quote}{run_dir}{quote}", "trainer.max_steps=5")
    assert result.returncode == 0, result.stderr[-3000:]
    state = load_checkpoint(run_dir)
    assert state["step"] == 5 and state["config"]["model"]["g_width"] == 8  # replayed, same directory


def test_unquote_reads_hydras_quoted_strings():
    assert unquote("'a b'") == "a b" and unquote('"a b"') == "a b" and unquote("plain") == "plain"
    assert unquote("'it\\'s'") == "it's"


def test_a_resume_reads_its_settings_from_the_checkpoint_never_from_an_edited_record(finished_run, tmp_path):
    """The checkpoint is the source of truth and the record is what the run wrote: an edited or damaged record is
    neither read nor obeyed; the resume runs the checkpoint's settings and writes the record anew."""
    copy = tmp_path / "run"
    (copy / ".hydra").mkdir(parents=True)
    (copy / "checkpoints").mkdir()
    (copy / "checkpoints" / "last.pt").write_bytes((finished_run / "checkpoints" / "last.pt").read_bytes())
    (copy / ".hydra" / "overrides.yaml").write_text("- a: [unclosed\n")
    (copy / ".hydra" / "config.yaml").write_text("model: {g_width: 999}\n")
    result = run_train(f"trainer.resume={copy}", "trainer.max_steps=6", tiny=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    state = load_checkpoint(copy)
    assert state["step"] == 6 and state["config"]["model"]["g_width"] == 8
    assert yaml.safe_load((copy / ".hydra" / "config.yaml").read_text())["model"]["g_width"] == 8


def test_resume_auto_never_continues_another_learning_rate(tmp_path):
    first = run_train("trainer.max_steps=2", "trainer.resume=auto", "optim.lr=1e-4", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    other = run_train("trainer.max_steps=2", "trainer.resume=auto", "optim.lr=3e-4", cwd=tmp_path)
    assert other.returncode == 0, other.stderr[-3000:]
    runs = sorted(tmp_path.glob("outputs/**/checkpoints/last.pt"))
    assert len(runs) == 2  # a run of its own, not the 1e-4 run continued
    lrs = {torch.load(p, weights_only=True)["config"]["optim"]["lr"] for p in runs}
    assert lrs == {1e-4, 3e-4}
