"""The resume contract: what `trainer.resume=RUN` may change, what it refuses; a refusal touches nothing."""

from __future__ import annotations

import shutil

import pytest
import torch
import yaml
from conftest import compose_config, output_of, run_train, snapshot

from gan.checkpoint import load_checkpoint
from gan.training import train
from gan.training.state import lr_scale

REFUSED = {  # a change the contract refuses, or a bad value -> what the paragraph names
    "loss=hinge": "loss.name: 'bce' -> 'hinge'",
    "data.image_size=32": "data.image_size: 16 -> 32",
    "optim.beta1=0.9": "optim.beta1: 0.0 -> 0.9",
    "trainer.seed=1": "trainer.seed: 0 -> 1",
    "trainer.threads=-1": "trainer.threads",
    "trainer.device=cuda:7": "trainer.device",
    "trainer.max_steps=2": "trainer.max_steps=2 is below the step of the checkpoint being resumed (6)",
}


@pytest.mark.parametrize(("bad", "said"), REFUSED.items(), ids=REFUSED)
def test_a_refused_resume_leaves_the_run_as_it_was_and_its_plain_resume_works(tiny_run, tmp_path, bad, said):
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    before = snapshot(run_dir)
    given = dict(arg.split("=", 1) for arg in ("trainer.max_steps=8", bad))
    refused = run_train(f"trainer.resume={run_dir}", *(f"{k}={v}" for k, v in given.items()), cwd=tmp_path)
    assert refused.returncode == 2 and said in output_of(refused) and "Traceback" not in output_of(refused)
    assert snapshot(run_dir) == before  # the bad value reached no file: .hydra/overrides.yaml included
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # and no folder of its own is left either
    assert run_train(f"trainer.resume={run_dir}", "trainer.max_steps=8", cwd=tmp_path).returncode == 0
    assert load_checkpoint(run_dir)["step"] == 8


def test_a_new_learning_rate_takes_effect_is_recorded_and_a_resume_at_max_steps_trains_nothing(tiny_run, tmp_path):
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")  # at step 6
    rates = ("optim.lr=1e-5", "optim.lr_d=3e-5", "optim.lr_decay=0.5")
    result = run_train(f"trainer.resume={run_dir}", "trainer.max_steps=8", *rates)
    assert result.returncode == 0, result.stderr[-3000:]
    state, scale = load_checkpoint(run_dir), lr_scale(7, 8, 0.5)  # the last update's: the new decay's at step 7 of 8
    assert state["step"] == 8 and scale == pytest.approx(1 / 4)
    assert (state["config"]["optim"]["lr"], state["config"]["optim"]["lr_decay"]) == (1e-5, 0.5)
    assert [g["lr"] for g in state["opt_g"]["param_groups"]] == [pytest.approx(1e-5 * scale)]
    assert [g["lr"] for g in state["opt_d"]["param_groups"]] == [pytest.approx(3e-5 * scale)]
    # the record is the run's config as it now runs (the checkpoint's, with the new rates) and this command
    recorded = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert recorded["optim"]["lr"] == 1e-5 and recorded["model"]["g_width"] == 8
    assert "optim.lr=1e-5" in yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    # a resume already at max_steps trains nothing and is no error
    assert train(compose_config(f"trainer.resume={run_dir}", "trainer.max_steps=8"), run_dir).step == 8
    after = load_checkpoint(run_dir)
    assert after["step"] == 8 and all(torch.equal(state["G"][key], after["G"][key]) for key in state["G"])


NAMED = {  # where the run lies under the launch folder, how trainer.resume names it there, what became of its record
    "quoted '": ("my run", "'{run}'", "kept"),  # a space: the path quoted for Hydra
    'quoted ", its record edited': ("my run", '"{run}"', "edited"),
    "bare, with a space, its record deleted": ("my run", "{run}", "deleted"),
    "a relative path to its checkpoint file": ("outputs/runs/a", "outputs/runs/a/checkpoints/last.pt", "kept"),
}


@pytest.mark.parametrize(("where", "named", "fate"), NAMED.values(), ids=NAMED)
def test_a_resume_reads_its_settings_from_the_checkpoint_never_from_its_record(tiny_run, tmp_path, where, named, fate):
    # the run goes on in place however it is named; an edited, damaged or deleted record is neither read nor obeyed:
    # the resume runs the checkpoint's settings (debug=tiny's, not the defaults: the command names none) and writes
    # the record anew
    run_dir = shutil.copytree(tiny_run, tmp_path / where)
    if fate == "edited":
        (run_dir / ".hydra" / "overrides.yaml").write_text("- a: [unclosed\n")
        (run_dir / ".hydra" / "config.yaml").write_text("model: {g_width: 999}\n")
    elif fate == "deleted":
        shutil.rmtree(run_dir / ".hydra")
    resume = (f"trainer.resume={named.format(run=run_dir)}", "trainer.max_steps=8", "trainer.threads=1")
    result = run_train(*resume, cwd=tmp_path, tiny=False)
    assert result.returncode == 0, output_of(result)[-3000:]
    state = load_checkpoint(run_dir)
    assert state["step"] == 8 and state["config"]["model"]["g_width"] == 8
    assert yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())["model"]["g_width"] == 8
    # no folder of its own: the run went on in place
    assert sorted(p.name for p in tmp_path.iterdir()) == [where.split("/")[0]]
    assert all(run_dir in p.parents for p in tmp_path.rglob("*") if p.is_file())


def test_a_loose_checkpoint_resumes_with_its_own_settings_and_refuses_another_model(tiny_run, tmp_path):
    loose = shutil.copy(tiny_run / "checkpoints" / "last.pt", tmp_path / "loose.pt")  # outside any run directory
    refused = run_train(f"trainer.resume={loose}", "model.g_width=16", f"hydra.run.dir={tmp_path / 'new'}")
    assert refused.returncode == 2 and "model.g_width: 8 -> 16" in output_of(refused), output_of(refused)[-3000:]
    assert "Traceback" not in output_of(refused) and not (tmp_path / "new").exists()
    result = run_train(f"trainer.resume={loose}", "trainer.max_steps=9", cwd=tmp_path, tiny=False)
    assert result.returncode == 0, output_of(result)[-3000:]
    assert [load_checkpoint(p)["step"] for p in (tmp_path / "outputs").rglob("last.pt")] == [9]


def test_a_resume_of_a_hinge_run_keeps_its_settings_and_holds_a_named_group_to_them_even_at_its_default(tmp_path):
    # a resume's overrides.yaml holds its command (debug=tiny, trainer.resume, max_steps), not loss=hinge: the
    # next resume compares only what those overrides set, so the run's hinge loss is no disagreement; the settings
    # the command does not name are the checkpoint's (a group's choice, a plain key), not the defaults
    run_dir = tmp_path / "run"
    first = run_train("loss=hinge", "model.ema_decay=0.99", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert first.returncode == 0, output_of(first)[-3000:]
    for steps in (8, 10):
        resumed = run_train(f"trainer.resume={run_dir}", f"trainer.max_steps={steps}", cwd=tmp_path)
        assert resumed.returncode == 0, output_of(resumed)[-3000:]
    assert "loss=hinge" not in (run_dir / ".hydra" / "overrides.yaml").read_text()
    state = load_checkpoint(run_dir)
    cfg = state["config"]
    assert (state["step"], cfg["loss"]["name"], cfg["model"]["ema_decay"]) == (10, "hinge", 0.99)
    # `loss=bce` names loss.name at the schema's default: it is refused, not dropped unsaid
    refused = run_train(f"trainer.resume={run_dir}", "loss=bce", "trainer.max_steps=12", cwd=tmp_path)
    assert refused.returncode == 2 and "loss.name: 'hinge' -> 'bce'" in output_of(refused), output_of(refused)[-3000:]
