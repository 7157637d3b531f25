"""Checkpoints that never lose work: atomic writes, exact resume, signals, NaN, bad input."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY, compose_config, run_train

import gan.core.losses
from gan.checkpoint import CheckpointError, load_checkpoint, load_module_state, require_training_state, save_checkpoint
from gan.core.losses import LOSSES, AdversarialLoss
from gan.core.models import Generator
from gan.training import NonFiniteLossError, train

# atomic writes ---------------------------------------------------------------------------------


def test_a_crash_during_a_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint({"G": {}, "D": {}, "step": 1, "num_classes": 0, "config": {}}, path)

    def crash_midway(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint({"G": {}, "D": {}, "step": 2, "num_classes": 0, "config": {}}, path)
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left behind


def test_keep_checkpoints_keeps_the_newest_numbered_ones(tmp_path):
    train(compose_config("trainer.max_steps=6", "trainer.checkpoint_every=2", "trainer.keep_checkpoints=2"), tmp_path)
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["last.pt", "step_000004.pt", "step_000006.pt"]
    assert load_checkpoint(folder / "step_000004.pt")["step"] == 4
    assert load_checkpoint(folder / "last.pt")["step"] == 6


# exact resume ----------------------------------------------------------------------------------


def assert_same_state(a: dict, b: dict) -> None:
    for key in ("G", "D", "G_ema"):
        assert a[key].keys() == b[key].keys()
        for name in a[key]:
            assert torch.equal(a[key][name], b[key][name]), f"{key}.{name} differs"
    for key in ("opt_g", "opt_d"):
        for index, state in a[key]["state"].items():
            for name, value in state.items():
                assert torch.equal(value, b[key]["state"][index][name]), f"{key}[{index}].{name} differs"
    assert a["step"] == b["step"] and a["data"] == b["data"]


def stop_at(step: int):
    """An after_step that ends the run at `step`, as a signal would: the interrupted run of a test."""
    return lambda state: state.step >= step


@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_run_is_bit_identical_to_an_uninterrupted_one(tmp_path, workers):
    # 256 images / 32 per batch = 8 batches an epoch: the resumed half crosses an epoch boundary.
    # The interrupted run stops at step 5 of 12; the learning-rate decay (optim.lr_decay, the last
    # half) lowers updates 8-12, all in the resumed half.
    common = (
        "trainer.max_steps=12",
        "optim.lr_decay=0.5",
        "trainer.checkpoint_every=100",
        f"data.num_workers={workers}",
    )
    train(compose_config(*common), tmp_path / "straight")
    train(compose_config(*common), tmp_path / "split", after_step=stop_at(5))
    assert load_checkpoint(tmp_path / "split")["step"] == 5
    train(compose_config(*common, f"trainer.resume={tmp_path / 'split'}"), tmp_path / "split")
    straight = load_checkpoint(tmp_path / "straight")
    resumed = load_checkpoint(tmp_path / "split")
    assert resumed["data"] == {"epoch": 1, "batch": 4}
    assert_same_state(straight, resumed)


def test_a_resume_keeps_the_runs_thread_count_whatever_the_default_is_by_then(tmp_path, monkeypatch, caplog):
    # The default trainer.threads=0 (debug=tiny fixes 1) computes with torch's count, 2 here. Before the
    # resume the default drops to 1, as a busier machine, OMP_NUM_THREADS or another affinity would make
    # it: the resume still computes with the 2 its checkpoint records, and matches the straight run.
    monkeypatch.setattr("gan.training.threads.available_cpus", lambda: 2)  # a 1-CPU machine too
    common = ("trainer.max_steps=4", "trainer.checkpoint_every=100", "trainer.threads=0")
    torch.set_num_threads(2)
    train(compose_config(*common), tmp_path / "straight")
    train(compose_config(*common), tmp_path / "split", after_step=stop_at(2))
    shutil.copytree(tmp_path / "split", tmp_path / "forced")
    torch.set_num_threads(1)
    train(compose_config(*common, f"trainer.resume={tmp_path / 'split'}"), tmp_path / "split")
    straight = load_checkpoint(tmp_path / "straight")
    assert straight["threads"] == 2 and load_checkpoint(tmp_path / "split")["threads"] == 2
    assert_same_state(straight, load_checkpoint(tmp_path / "split"))
    # the count is part of the arithmetic: a resume told trainer.threads=1 differs, and says so
    resume = f"trainer.resume={tmp_path / 'forced'}"
    train(compose_config(*common[:2], "trainer.threads=1", resume), tmp_path / "forced")
    with pytest.raises(AssertionError, match="differs"):
        assert_same_state(straight, load_checkpoint(tmp_path / "forced"))
    assert "computed with 2 torch thread(s) and resumes with 1 (trainer.threads=1)" in caplog.text


def test_a_finished_run_extended_with_constant_rates_is_bit_identical_to_a_longer_one(tmp_path):
    # Raising trainer.max_steps on resume re-plans a decaying schedule (the decay is a fraction of
    # the new length); with constant rates (optim.lr_decay=0, the default) the extension is exact.
    common = ("optim.lr_decay=0", "trainer.checkpoint_every=100")
    train(compose_config("trainer.max_steps=7", *common), tmp_path / "straight")
    train(compose_config("trainer.max_steps=3", *common), tmp_path / "split")
    train(compose_config("trainer.max_steps=7", f"trainer.resume={tmp_path / 'split'}", *common), tmp_path / "split")
    assert_same_state(load_checkpoint(tmp_path / "straight"), load_checkpoint(tmp_path / "split"))


# signals ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_writes_a_checkpoint_and_the_run_resumes(tmp_path, sig, code):
    run_dir = tmp_path / "run"
    args = [
        sys.executable,
        str(ROOT / "train.py"),
        *TINY,
        "trainer.max_steps=100000",
        "trainer.checkpoint_every=100000",
        f"hydra.run.dir={run_dir}",
    ]
    process = subprocess.Popen(
        args,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output = []
    for line in process.stdout:  # wait until training is under way
        output.append(line)
        if "step 4 " in line:
            break
    process.send_signal(sig)
    rest, _ = process.communicate(timeout=120)
    output = "".join(output) + rest
    assert process.returncode == code, output[-3000:]
    assert f"Stopped by {sig.name}" in output and "trainer.resume=" in output
    stopped_at = load_checkpoint(run_dir)["step"]
    assert 4 <= stopped_at < 100000
    resumed = run_train(f"trainer.resume={run_dir}", f"trainer.max_steps={stopped_at + 2}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert load_checkpoint(run_dir)["step"] == stopped_at + 2


# non-finite losses -----------------------------------------------------------------------------


def nan_after(calls: int, monkeypatch) -> None:
    """Make the bce G loss NaN from its `calls`-th call on."""
    count = {"n": 0}
    real = LOSSES["bce"]

    def g_loss(fake_logits):
        count["n"] += 1
        value = real.g(fake_logits)
        return value * float("nan") if count["n"] >= calls else value

    monkeypatch.setitem(gan.core.losses.LOSSES, "bce", AdversarialLoss(real.d, g_loss))


def test_nan_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    nan_after(5, monkeypatch)
    with pytest.raises(NonFiniteLossError, match=r"step 5: loss/d=[-0-9.e]+, loss/g=nan"):
        train(compose_config("trainer.max_steps=8", "trainer.checkpoint_every=2", "trainer.log_every=3"), tmp_path)
    state = load_checkpoint(tmp_path)
    assert state["step"] == 4
    assert all(torch.isfinite(t).all() for t in state["G"].values() if t.is_floating_point())


def test_nan_steps_are_skipped_with_on_nan_skip(tmp_path, monkeypatch):
    nan_after(3, monkeypatch)
    result = train(compose_config("trainer.max_steps=4", "trainer.on_nan=skip"), tmp_path)
    assert result.step == 4
    state = load_checkpoint(tmp_path)
    assert all(torch.isfinite(t).all() for t in state["G"].values() if t.is_floating_point())


# bad input: a clear message, a non-zero exit, nothing overwritten -----------------------------


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("good") / "run"
    assert run_train("trainer.max_steps=2", f"hydra.run.dir={run_dir}").returncode == 0
    return run_dir


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class RunsCode:
    """Unpickling this runs os.system: a stand-in for a malicious checkpoint."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def bad_files(tmp_path: Path, good: Path) -> dict[str, Path]:
    files = {name: tmp_path / f"{name}.pt" for name in ("truncated", "text", "not_checkpoint", "code")}
    data = (good / "checkpoints" / "last.pt").read_bytes()
    files["truncated"].write_bytes(data[: len(data) // 2])
    files["text"].write_text("this is not a checkpoint\n")
    torch.save({"weights": torch.zeros(2)}, files["not_checkpoint"])
    torch.save({"G": RunsCode(tmp_path / "pwned"), "D": {}, "step": 0, "config": {}}, files["code"])
    return files


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "Checkpoint not found"),
        ("truncated", "it is truncated: torch.save's zip archive cut short"),
        ("text", "it is corrupt or not a PyTorch file"),
        ("not_checkpoint", "is not a checkpoint of this project"),
        ("code", "Refused to load"),
    ],
)
def test_bad_checkpoint_is_refused(tmp_path, good_run, case, message):
    path = tmp_path / "nothing-here.pt" if case == "missing" else bad_files(tmp_path, good_run)[case]
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)
    assert not (tmp_path / "pwned").exists()  # the crafted pickle's code never ran


@pytest.mark.parametrize("case", ["missing", "truncated", "code"])
def test_bad_resume_exits_cleanly_and_overwrites_nothing(tmp_path, good_run, case):
    path = tmp_path / "nothing-here.pt" if case == "missing" else bad_files(tmp_path, good_run)[case]
    before = digest(good_run / "checkpoints" / "last.pt")
    result = run_train(f"trainer.resume={path}", f"hydra.run.dir={tmp_path / 'new'}")
    output = result.stdout + result.stderr
    assert result.returncode == 2
    assert str(path) in output and "Traceback" not in output
    assert not (tmp_path / "new" / "checkpoints" / "last.pt").exists()
    assert digest(good_run / "checkpoints" / "last.pt") == before
    assert not (tmp_path / "pwned").exists()


def test_architecture_change_on_resume_names_the_key(tmp_path, good_run):
    checkpoint = tmp_path / "elsewhere.pt"  # outside its run dir: the command line defines the model
    checkpoint.write_bytes((good_run / "checkpoints" / "last.pt").read_bytes())
    result = run_train(f"trainer.resume={checkpoint}", "model.g_width=16", f"hydra.run.dir={tmp_path / 'new'}")
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output
    assert "model.g_width: 8 -> 16" in output  # the checkpoint's own config, against this command's
    assert not (tmp_path / "new" / "checkpoints").exists()


def test_shape_mismatch_lists_each_tensor_with_both_shapes(tiny_gan):
    G, _ = tiny_gan  # width 8
    wider = Generator(z_dim=16, width=16, channels=1, image_size=16)
    with pytest.raises(CheckpointError) as caught:
        load_module_state(G, wider.state_dict(), "generator")
    message = str(caught.value)
    assert "does not match the generator built from the config" in message
    assert "net.0.weight: (16, 32, 4, 4) in the checkpoint, (16, 16, 4, 4) in the model" in message


# resume=auto -----------------------------------------------------------------------------------


def test_resume_auto_continues_the_matching_run_or_starts_one(tmp_path):
    first = run_train("trainer.max_steps=2", "trainer.resume=auto", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    [run_dir] = [p.parent.parent for p in (tmp_path / "outputs").glob("*/*/checkpoints/last.pt")]
    again = run_train("trainer.max_steps=4", "trainer.resume=auto", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert load_checkpoint(run_dir)["step"] == 4  # continued in place
    other = run_train("trainer.max_steps=2", "trainer.resume=auto", "loss=hinge", cwd=tmp_path)
    assert other.returncode == 0, other.stderr[-3000:]
    assert len(list((tmp_path / "outputs").glob("*/*/checkpoints/last.pt"))) == 2  # a new run


# every entry typed where a checkpoint is read, for train.py and evaluate.py alike (gan/checkpoint.py) -------


def _retyped(state: dict, entry: str, dtype: torch.dtype) -> None:
    state[entry] = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state[entry].items()}


def _group(entry: str, **settings: object):
    return lambda state: state[entry]["param_groups"][0].update(settings)


TYPED = {  # an edit of a trained checkpoint -> what the refusal says (the shared load, then the resume gate)
    "G booleans": (lambda s: _retyped(s, "G", torch.bool), "entry 'G' is damaged: 'net.0.weight' holds torch.bool"),
    "G_ema ints": (lambda s: _retyped(s, "G_ema", torch.int32), "entry 'G_ema' is damaged: 'module.net.0.weight' hol"),
    "D booleans": (lambda s: _retyped(s, "D", torch.bool), "entry 'D' is damaged: 'features.0.bias' holds torch.bool"),
    "betas as text": (_group("opt_g", betas=("a", 0.9)), "param_groups[0].betas holds ('a', 0.9) (tuple), where Adam"),
    "eps None": (_group("opt_d", eps=None), "param_groups[0].eps holds None (NoneType), where Adam takes a number"),
    "lr as text": (_group("opt_g", lr="0.1"), "param_groups[0].lr holds '0.1' (str), where Adam takes a number"),
    "amsgrad 1": (_group("opt_d", amsgrad=1), "param_groups[0].amsgrad holds 1 (int), where Adam takes True or False"),
    "threads as text": (lambda s: s.update(threads="2"), "entry 'threads' is damaged: it holds '2' (str)"),
    "pack a number": (lambda s: s.update(pack=5), "entry 'pack' is damaged: it holds 5 (int)"),
    "best as text": (lambda s: s.update(best="7.5"), "entry 'best' is damaged: it holds '7.5' (str)"),
    "environment a list": (lambda s: s.update(environment=[1]), "entry 'environment' is damaged: it holds [1]"),
    "kind a number": (lambda s: s.update(kind=3), "entry 'kind' is damaged: it holds 3 (int)"),
}


@pytest.mark.parametrize("edit, says", TYPED.values(), ids=TYPED.keys())
def test_a_checkpoint_entry_of_the_wrong_type_is_refused_where_it_is_read(tiny_run, tmp_path, edit, says):
    state = torch.load(tiny_run / "checkpoints" / "last.pt", weights_only=True)
    edit(state)
    torch.save(state, tmp_path / "last.pt")
    with pytest.raises(CheckpointError, match=re.escape(says)):
        require_training_state(load_checkpoint(tmp_path / "last.pt"), tmp_path / "last.pt")


@pytest.mark.parametrize(
    "entry, value",
    [
        ("opt_g", KeyError),  # missing
        ("opt_d", {"state": {}, "param_groups": "not a list"}),  # wrong type
        ("data", {"epoch": "x", "batch": 0}),
        ("rng", {"python": (3, (1, 2), None), "torch": torch.zeros(3, dtype=torch.uint8), "cuda": []}),
        ("fixed_z", torch.zeros(5)),
    ],
)
def test_a_damaged_checkpoint_entry_is_named(tiny_run, tmp_path, entry, value):
    state = torch.load(tiny_run / "checkpoints" / "last.pt", weights_only=True)
    if value is KeyError:
        del state[entry]
    else:
        state[entry] = value
    torch.save(state, tmp_path / "damaged.pt")
    result = run_train(
        f"trainer.resume={tmp_path / 'damaged.pt'}", "trainer.max_steps=8", f"hydra.run.dir={tmp_path / 'run'}"
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output and re.search(rf"entry '{entry}' is (missing|damaged)", output)
    assert not (tmp_path / "run" / "checkpoints").exists()
