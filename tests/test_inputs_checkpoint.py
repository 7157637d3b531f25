"""Hostile but realistic checkpoints: a step that is no whole number, entries of the wrong type, NaN or
inf in a tensor a resume starts from, a damaged stored config, a config that disagrees with the weights,
an impossible data position, and Ctrl-C during evaluate.py. Each ends with one paragraph that names the
file and the entry, a non-zero exit and no traceback (the real CLI in a subprocess where it matters),
and never blames the command for damage in the file."""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import conftest
import pytest
import torch
from conftest import ROOT, run_train

from gan.checkpoint import load_checkpoint, require_training_state, save_checkpoint, stored_config
from gan.errors import CheckpointError
from gan.evaluation.pipeline import interrupted

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}


def run_evaluate(*overrides: str) -> subprocess.CompletedProcess:
    """The real `python evaluate.py` command line on the CPU with one thread, in process."""
    return conftest.run_evaluate("device=cpu", "threads=1", *overrides)


def output_of(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr  # Hydra's logging writes to stdout


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished 4-step run that kept numbered copies: checkpoints/step_000002.pt and step_000004.pt."""
    run_dir = tmp_path_factory.mktemp("inputs-checkpoint") / "run"
    result = run_train(
        "trainer.max_steps=4",
        "trainer.checkpoint_every=2",
        "trainer.keep_checkpoints=2",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def conditional_run(tmp_path_factory) -> Path:
    """A finished 2-step class-conditional run (G(z, y) on the 10 digit classes)."""
    run_dir = tmp_path_factory.mktemp("inputs-checkpoint-conditional") / "run"
    result = run_train("trainer.max_steps=2", "model.conditional=true", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def state_of(run_dir: Path) -> dict[str, Any]:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def with_config(state: dict[str, Any], group: str, key: str, value: object) -> dict[str, Any]:
    """A copy of `state` whose stored config holds `value` at group.key (the rest shared)."""
    config = {**state["config"], group: {**state["config"][group], key: value}}
    return {**state, "config": config}


def written(state: dict[str, Any], path: Path) -> Path:
    torch.save(state, path)  # not save_checkpoint: a damaged file as another program would leave it
    return path


# 1. a step that is not a whole number -------------------------------------------------------------


@pytest.mark.parametrize("step", ["abc", 1.5, -3, True], ids=["str", "float", "negative", "bool"])
def test_a_step_that_is_not_a_whole_number_is_refused_where_the_checkpoint_is_loaded(run, tmp_path, step):
    path = written({**state_of(run), "step": step}, tmp_path / "bad-step.pt")
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    message = str(caught.value)
    assert f"{path}: its entry 'step' is damaged: it holds {step!r}" in message and "\n" not in message
    # alone in its folder: the message says there is no other checkpoint, and does not invent one
    assert "No numbered copy (step_NNNNNN.pt) is kept beside it" in message


@pytest.mark.parametrize("program", ["train.py", "evaluate.py"])
@pytest.mark.parametrize("step", ["abc", 1.5], ids=["str", "float"])
def test_a_damaged_step_ends_resume_and_evaluate_with_one_paragraph(run, tmp_path, step, program):
    path = written({**state_of(run), "step": step}, tmp_path / "bad-step.pt")
    if program == "train.py":
        result = run_train(f"trainer.resume={path}", "trainer.max_steps=8", f"hydra.run.dir={tmp_path / 'out'}")
    else:
        result = run_evaluate(f"checkpoint={path}", f"hydra.run.dir={tmp_path / 'out'}")
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"{path}: its entry 'step' is damaged" in output and "Traceback" not in output
    assert not (tmp_path / "out" / "checkpoints").exists() and not (tmp_path / "out" / "metrics.json").exists()


# 2. evaluate.py on entries of the wrong type ------------------------------------------------------

EVALUATE_CASES: dict[str, tuple[Callable[[dict], dict], str]] = {
    "G_ema=7": (lambda s: {**s, "G_ema": 7}, "its entry 'G_ema' is damaged: it holds 7 (int)"),
    "G=list": (lambda s: {**s, "G": [1, 2]}, "its entry 'G' is damaged: it holds [1, 2] (list)"),
    "num_classes='x'": (lambda s: {**s, "num_classes": "x"}, "its entry 'num_classes' is damaged: it holds 'x'"),
    "model.z_dim='abc'": (lambda s: with_config(s, "model", "z_dim", "abc"), "is damaged: model.z_dim: Value 'abc'"),
    "model.conditional='x'": (lambda s: with_config(s, "model", "conditional", "x"), "is damaged: model.conditional"),
    "data.image_size=[16]": (lambda s: with_config(s, "data", "image_size", [16]), "is damaged: data.image_size"),
}


@pytest.mark.parametrize("case", EVALUATE_CASES)
def test_evaluate_names_the_file_and_the_damaged_entry(run, tmp_path, case):
    damage, named = EVALUATE_CASES[case]
    path = written(damage(state_of(run)), tmp_path / "damaged.pt")
    result = run_evaluate(f"checkpoint={path}", f"hydra.run.dir={tmp_path / 'eval'}")
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert str(path) in output and named in output and "Traceback" not in output
    assert "another version" not in output  # a wrong type is damage, not a version
    assert not (tmp_path / "eval" / "metrics.json").exists()


# 3. NaN or inf in a tensor a resume starts from ---------------------------------------------------


def poison(state: dict[str, Any], entry: str, key: str, slot: str = "", value: float = math.nan) -> dict[str, Any]:
    """A copy of `state` with one tensor filled with `value`: state[entry][key], or for an optimizer
    its parameter `key`'s moment `slot`."""
    copy = {**state}
    if slot:
        slots = {index: dict(moments) for index, moments in state[entry]["state"].items()}
        slots[key][slot] = slots[key][slot].clone().fill_(value)
        copy[entry] = {**state[entry], "state": slots}
    else:
        copy[entry] = {**state[entry], key: state[entry][key].clone().fill_(value)}
    return copy


SN_U = "features.2.parametrizations.weight.0._u"
NONFINITE = {  # (entry, key, slot), and the name the message gives the tensor
    "G weight": (("G", "net.0.weight", ""), "G.net.0.weight"),
    # the default D's spectral norm: a power-iteration vector (a buffer, as BatchNorm's statistics are)
    "D spectral norm u": (("D", SN_U, ""), f"D.{SN_U}"),
    "G_ema BatchNorm running_mean": (("G_ema", "module.net.1.running_mean", ""), "G_ema.module.net.1.running_mean"),
    "opt_g exp_avg": (("opt_g", 0, "exp_avg"), "opt_g.state[0].exp_avg"),
    "opt_d exp_avg_sq": (("opt_d", 3, "exp_avg_sq"), "opt_d.state[3].exp_avg_sq"),
}


@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("where", NONFINITE)
def test_a_resume_refuses_a_checkpoint_holding_nan_or_inf_naming_the_tensor(run, tmp_path, where, value):
    (entry, key, slot), name = NONFINITE[where]
    state = poison(state_of(run), entry, key, slot, value)
    with pytest.raises(CheckpointError) as caught:
        require_training_state(state, str(tmp_path / "last.pt"))
    message = str(caught.value)
    assert "it holds NaN or inf in 1 of its" in message and f"({name})" in message
    assert "The checkpoint is damaged and training cannot continue from it" in message


def test_resuming_a_run_whose_last_checkpoint_holds_inf_names_the_copies_kept_beside_it(run, tmp_path):
    copy = Path(shutil.copytree(run, tmp_path / "run"))  # plain copies: last.pt and its numbered twin apart
    last = copy / "checkpoints" / "last.pt"
    save_checkpoint(poison(state_of(copy), "D", SN_U, value=math.inf), last)
    before = {p.name: digest(p) for p in (copy / "checkpoints").iterdir()}
    result = run_train(f"trainer.resume={copy}", "trainer.max_steps=8")
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"Cannot resume from {last}: it holds NaN or inf in 1 of its" in output
    assert f"(D.{SN_U})" in output and "Traceback" not in output
    newest = copy / "checkpoints" / "step_000004.pt"
    assert f"Other checkpoints are kept beside it (step_000004.pt, step_000002.pt): resume from {newest}" in output
    # not the words of a run that diverged while training: nothing trained, nothing was written
    assert "Lower optim.lr" not in output and "last good one" not in output and "Non-finite loss" not in output
    assert {p.name: digest(p) for p in (copy / "checkpoints").iterdir()} == before


def test_resuming_a_lone_checkpoint_with_a_nan_moment_says_no_copy_is_kept(run, tmp_path):
    path = written(poison(state_of(run), "opt_d", 3, "exp_avg_sq"), tmp_path / "lone.pt")
    result = run_train(f"trainer.resume={path}", "trainer.max_steps=8", f"hydra.run.dir={tmp_path / 'out'}")
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"Cannot resume from {path}: it holds NaN or inf" in output and "(opt_d.state[3].exp_avg_sq)" in output
    assert "No numbered copy (step_NNNNNN.pt) is kept beside it" in output and "Traceback" not in output
    assert "Lower optim.lr" not in output and not (tmp_path / "out" / "checkpoints").exists()


# 4. a damaged stored config is the file's fault, an unknown key may be another version's ----------

DAMAGED_CONFIGS: dict[str, tuple[Callable[[dict], object], str]] = {
    "not a mapping": (lambda c: 5, "it is 5 (int), not a mapping of groups"),
    "a list": (lambda c: [c], "not a mapping of groups"),
    "a group replaced by a number": (lambda c: {**c, "model": 5}, "its group 'model' is 5 (int)"),
    "a group missing": (lambda c: {k: v for k, v in c.items() if k != "optim"}, "it has no 'optim' group"),
    "a wrongly typed value": (lambda c: {**c, "model": {**c["model"], "z_dim": "abc"}}, "model.z_dim: Value 'abc'"),
    "an unknown value type": (
        lambda c: {**c, "trainer": {**c["trainer"], "seed": torch.zeros(2)}},
        "trainer.seed: Value 'Tensor' is not a supported primitive type",
    ),
    "a bool that is none": (lambda c: {**c, "model": {**c["model"], "conditional": "maybe"}}, "model.conditional"),
}


@pytest.mark.parametrize("case", DAMAGED_CONFIGS)
def test_a_damaged_stored_config_is_called_damaged_not_another_version(run, tmp_path, case):
    damage, detail = DAMAGED_CONFIGS[case]
    source = tmp_path / "last.pt"
    with pytest.raises(CheckpointError) as caught:
        stored_config(damage(state_of(run)["config"]), source)
    message = str(caught.value)
    assert f"The config stored in {source} is damaged: " in message and detail in message
    assert "another version" not in message and "this command" not in message and "\n" not in message


def test_an_unknown_stored_key_may_be_another_version_or_an_edit(run, tmp_path):
    source = tmp_path / "last.pt"
    with pytest.raises(CheckpointError) as caught:
        stored_config(with_config(state_of(run), "model", "num_classes", "x")["config"], source)
    message = str(caught.value)
    assert f"The config stored in {source} does not fit this version's settings" in message
    assert "model.num_classes is not a setting of this version" in message
    assert "another version of this project" in message and "edited" in message and "is damaged" not in message


def test_resuming_a_run_whose_stored_config_is_damaged_blames_the_file_not_the_command(run, tmp_path):
    copy = Path(shutil.copytree(run, tmp_path / "run"))
    last = copy / "checkpoints" / "last.pt"
    save_checkpoint(with_config(state_of(copy), "model", "g_width", "wide"), last)
    result = run_train(f"trainer.resume={copy}", "trainer.max_steps=8")
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"The config stored in {last} is damaged: model.g_width" in output and "Traceback" not in output
    assert "another version" not in output and "this command changes" not in output
    assert "Other checkpoints are kept beside it" in output


# 5. a config that disagrees with the weights: evaluate.py has no model.* to change ----------------


@pytest.mark.parametrize("num_classes", ["kept", 0], ids=["num_classes-kept", "num_classes-0"])
def test_a_conditional_checkpoint_marked_unconditional_is_a_checkpoint_at_odds_with_itself(
    conditional_run, tmp_path, num_classes
):
    state = with_config(state_of(conditional_run), "model", "conditional", False)
    if num_classes != "kept":
        state["num_classes"] = num_classes
    path = written(state, tmp_path / "edited.pt")
    result = run_evaluate(f"checkpoint={path}", f"hydra.run.dir={tmp_path / 'eval'}")
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"config stored in {path}" in output and "disagree" in output and "damaged or edited" in output
    assert "Use the same model.*" not in output and "Traceback" not in output
    if num_classes == "kept":
        assert "model.conditional=false, but the checkpoint's entry 'num_classes' says" in output
    else:  # the first layer of the weights takes z_dim + 10 inputs, the model built from the config z_dim
        assert "net.0.weight: (26, 16, 4, 4) in the checkpoint, (16, 16, 4, 4) in the model" in output


def test_an_unconditional_checkpoint_marked_conditional_is_a_checkpoint_at_odds_with_itself(run, tmp_path):
    state = {**with_config(state_of(run), "model", "conditional", True), "num_classes": 10}
    path = written(state, tmp_path / "edited.pt")
    result = run_evaluate(f"checkpoint={path}", f"hydra.run.dir={tmp_path / 'eval'}")
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"The generator is built from the config stored in {path}: its config and weights disagree" in output
    assert "damaged or edited" in output and "Use the same model.*" not in output and "Traceback" not in output


# 6. a data position no run reaches ----------------------------------------------------------------

POSITIONS = {
    "negative epoch": {"epoch": -1, "batch": 2},
    "negative batch": {"epoch": 0, "batch": -3},
    "a string": {"epoch": 0, "batch": "3"},
    "a float": {"epoch": 0.0, "batch": 4},
    "a bool": {"epoch": False, "batch": 4},
    "a key missing": {"epoch": 0},
    "not a mapping": [0, 4],
    "beyond the step": {"epoch": 3, "batch": 4},  # 4 steps take 4 batches
    "far beyond the step": {"epoch": 0, "batch": 10**9},
}


@pytest.mark.parametrize("case", POSITIONS)
def test_an_impossible_data_position_is_refused_on_resume(run, tmp_path, case):
    state = {**state_of(run), "data": POSITIONS[case]}
    assert state["step"] == 4
    with pytest.raises(CheckpointError) as caught:
        require_training_state(state, str(tmp_path / "last.pt"))
    message = str(caught.value)
    assert f"Cannot resume from {tmp_path / 'last.pt'}: its entry 'data' is damaged" in message


def test_a_data_position_beyond_an_epoch_is_refused_when_the_stream_is_rebuilt(run, tmp_path):
    # 256 images / 32 a batch = 8 batches an epoch; step 40 could reach batch 20, no epoch has one
    path = written({**state_of(run), "step": 40, "data": {"epoch": 0, "batch": 20}}, tmp_path / "far.pt")
    result = run_train(f"trainer.resume={path}", "trainer.max_steps=42", f"hydra.run.dir={tmp_path / 'out'}")
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert "the checkpoint's entry 'data' places the batch stream at batch 20 of epoch 0" in output
    assert "256 images make 8 batches of data.batch_size=32" in output and "Traceback" not in output
    assert not (tmp_path / "out" / "checkpoints").exists()


# 7. Ctrl-C during evaluate.py ---------------------------------------------------------------------


@pytest.mark.slow  # a real Ctrl-C to a real process
def test_sigint_during_evaluate_says_what_was_saved_and_exits_130(run, tmp_path):
    eval_dir = tmp_path / "eval"
    args = [sys.executable, str(ROOT / "evaluate.py"), f"checkpoint={run}", "device=cpu", "threads=1"]
    # a classifier to train from scratch for many epochs: the evaluation is still at it when the signal comes
    args += ["num_samples=200", f"data.root={tmp_path / 'data'}", "metrics.classifier.epochs=200"]
    args += [f"hydra.run.dir={eval_dir}"]
    # its own session, as a terminal runs a command: Ctrl-C signals the whole process group
    process = subprocess.Popen(
        args, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output = []
        for line in process.stdout:  # wait until the evaluation is under way
            output.append(line)
            if "Evaluating " in line:
                break
        os.killpg(process.pid, signal.SIGINT)
        rest, _ = process.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    output = "".join(output) + rest
    assert process.returncode == 130, output[-3000:]
    assert f"Interrupted (SIGINT); nothing measured was saved: {eval_dir} holds no metrics.json" in output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output
    assert not (eval_dir / "metrics.json").exists()


def test_the_interruption_line_says_only_what_the_run_dir_holds(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / "evaluate.log").write_text("")
    nothing = f"Interrupted (SIGINT); nothing measured was saved: {tmp_path} holds no metrics.json."
    assert interrupted(tmp_path) == nothing  # Hydra's own .hydra/ and log are no outputs
    (tmp_path / "samples.png").write_bytes(b"")
    assert interrupted(tmp_path).endswith("holds no metrics.json, only partial outputs (samples.png).")
    (tmp_path / "metrics.json").write_text("{}")
    assert interrupted(tmp_path).startswith(f"Interrupted (SIGINT) after the metrics were saved to {tmp_path}")
