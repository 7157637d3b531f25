"""Checkpoints that never lose work: atomic writes, exact resume, signals, NaN, bad input."""

import dataclasses
import itertools
import math
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from conftest import ROOT, TINY, compose_config, output_of, run_evaluate, run_train, snapshot
from torch.utils._pytree import keystr, tree_flatten_with_path

import gan.core.losses
from gan.checkpoint import CheckpointError, load_checkpoint, require_training_state, save_checkpoint, stored_config
from gan.core.augment import AdaptiveAugment
from gan.core.losses import LOSSES, AdversarialLoss
from gan.evaluation.pipeline import build_generator
from gan.training import NonFiniteLossError, train
from gan.training.state import rng_state, set_rng_state


def test_a_crash_during_a_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path, state = tmp_path / "last.pt", {"G": {}, "D": {}, "num_classes": 0, "config": {}}
    save_checkpoint({**state, "step": 1}, path)

    def crash_midway(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_midway)
    pytest.raises(OSError, save_checkpoint, {**state, "step": 2}, path).match("disk full")
    assert load_checkpoint(path)["step"] == 1 and [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temp file


def assert_same_state(a: dict, b: dict) -> None:
    """Every tensor of G, D, the EMA and both Adam states, key for key, and the step and data position."""
    trees = [{key: s[key] for key in ("G", "D", "G_ema", "opt_g", "opt_d")} for s in (a, b)]
    x, y = ({keystr(p): t for p, t in tree_flatten_with_path(tree)[0] if torch.is_tensor(t)} for tree in trees)
    assert x.keys() == y.keys() and a["step"] == b["step"] and a["data"] == b["data"]
    for key, t in x.items():
        assert torch.equal(t, y[key]), f"{key} differs"


def stop_at(step: int):  # an after_step that ends the run at `step`, as a signal would: a test's interrupted run
    return lambda state: state.step >= step


@pytest.mark.parametrize("workers, extended", [(0, False), (2, False), (0, True)], ids=["0", "2 workers", "extended"])
def test_resumed_run_is_bit_identical_to_an_uninterrupted_one(tmp_path, workers, extended):
    # 8 batches an epoch (256 images / 32): the resumed half, steps 6-12, crosses an epoch and holds the decay;
    # extended: a run finished at step 5 given max_steps=12, so a constant rate (a decay would be re-planned)
    common = ("trainer.checkpoint_every=100", f"data.num_workers={workers}", f"optim.lr_decay={0 if extended else 0.5}")
    train(compose_config(*common, "trainer.max_steps=12"), tmp_path / "straight")
    first = compose_config(*common, f"trainer.max_steps={5 if extended else 12}")
    train(first, tmp_path / "split", after_step=None if extended else stop_at(5))
    assert load_checkpoint(tmp_path / "split")["step"] == 5
    train(compose_config(*common, "trainer.max_steps=12", f"trainer.resume={tmp_path / 'split'}"), tmp_path / "split")
    resumed = load_checkpoint(tmp_path / "split")
    assert resumed["data"] == {"epoch": 1, "batch": 4}
    assert_same_state(load_checkpoint(tmp_path / "straight"), resumed)


def test_a_resume_keeps_the_runs_thread_count_whatever_the_default_is_by_then(tmp_path, monkeypatch, caplog):
    # trainer.threads=0 computes with torch's count, 2 here; before the resume the default drops to 1 (a busier
    # machine, OMP_NUM_THREADS): the resume still computes with the 2 its checkpoint records, on the CPU (a GPU's
    # arithmetic is alike with any count)
    monkeypatch.setattr("gan.training.threads.available_cpus", lambda: 2)  # a 1-CPU machine too
    common = ("trainer.device=cpu", "trainer.max_steps=4", "trainer.checkpoint_every=100", "trainer.threads=0")
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
    train(compose_config(*common[:3], "trainer.threads=1", resume), tmp_path / "forced")
    with pytest.raises(AssertionError, match="differs"):
        assert_same_state(straight, load_checkpoint(tmp_path / "forced"))
    assert "computed with 2 torch thread(s) and resumes with 1 (trainer.threads=1)" in caplog.text


def test_a_run_moved_to_another_device_resumes_adas_draws_from_their_seed():
    """ADA's generator lives on the training device; a CPU generator's state is 5056 bytes, a CUDA one's 16, and
    neither takes the other's (the resume failed so on an H200). On the other device the draws start at the seed."""
    augment, cpu = AdaptiveAugment(["color"], target=0.6, speed_kimg=100, batch_size=8, seed=3), torch.device("cpu")
    rng, seeded = rng_state(cpu, augment), augment.generator.get_state()
    torch.rand(3, generator=augment.generator)
    set_rng_state({**rng, "augment": torch.zeros(16, dtype=torch.uint8)}, cpu, augment)  # as a GPU's generator saves
    assert not torch.equal(augment.generator.get_state(), seeded)  # left where it was: this device's stream
    set_rng_state(rng, cpu, augment)  # this device's own: restored
    assert torch.equal(augment.generator.get_state(), seeded)


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_writes_a_checkpoint_and_the_run_resumes(tmp_path, sig, code):
    run_dir = tmp_path / "run"
    steps = ("trainer.max_steps=100000", "trainer.checkpoint_every=100000", f"hydra.run.dir={run_dir}")
    env, args = {**os.environ, "PYTHONUNBUFFERED": "1"}, [sys.executable, str(ROOT / "train.py"), *TINY, *steps]
    process = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = run_until(process, "step 4 ")  # training is under way
    process.send_signal(sig)
    output = "".join(lines) + process.communicate(timeout=120)[0]
    assert process.returncode == code and f"Stopped by {sig.name}" in output and "trainer.resume=" in output, output
    stopped_at = load_checkpoint(run_dir)["step"]
    assert 4 <= stopped_at < 100000
    resumed = run_train(f"trainer.resume={run_dir}", f"trainer.max_steps={stopped_at + 2}", cwd=tmp_path)
    assert resumed.returncode == 0 and load_checkpoint(run_dir)["step"] == stopped_at + 2, resumed.stderr[-3000:]


def run_until(process: subprocess.Popen, text: str) -> tuple[str, ...]:  # its lines up to the first holding `text`
    lines = []
    for line in process.stdout:
        lines.append(line)
        if text in line:
            return tuple(lines)
    raise AssertionError("".join(lines)[-3000:])


def nan_after(calls: int, monkeypatch) -> None:  # the bce G loss NaN from its `calls`-th call on
    real, count = LOSSES["bce"], itertools.count(1)
    g_loss = AdversarialLoss(real.d, lambda logits: real.g(logits) * (math.nan if next(count) >= calls else 1.0))
    monkeypatch.setitem(gan.core.losses.LOSSES, "bce", g_loss)


def test_nan_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    nan_after(5, monkeypatch)
    stop, skip = tmp_path / "stop", tmp_path / "skip"
    with pytest.raises(NonFiniteLossError, match=r"step 5: loss/d=[-0-9.e]+, loss/g=nan"):
        train(compose_config("trainer.max_steps=8", "trainer.checkpoint_every=2", "trainer.log_every=3"), stop)
    assert load_checkpoint(stop)["step"] == 4
    monkeypatch.undo()
    nan_after(3, monkeypatch)  # trainer.on_nan=skip: the NaN steps are skipped, the run ends
    assert train(compose_config("trainer.max_steps=4", "trainer.on_nan=skip"), skip).step == 4
    for run in (stop, skip):
        assert all(torch.isfinite(t).all() for t in load_checkpoint(run)["G"].values() if t.is_floating_point())


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    """A finished 6-step run that kept numbered copies: checkpoints/step_000004.pt and step_000006.pt."""
    run_dir = tmp_path_factory.mktemp("good") / "run"
    steps = ("trainer.max_steps=6", "trainer.checkpoint_every=2", "trainer.keep_checkpoints=2")
    result = run_train(*steps, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@dataclasses.dataclass
class RunsCode:  # unpickling it runs os.system: a stand-in for a malicious checkpoint
    marker: Path

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


BAD = {  # what is wrong with the file -> how it is written (from last.pt's bytes), what its one line says
    "missing": (lambda path, data: None, "Checkpoint not found"),
    "empty": (lambda path, data: path.write_bytes(b""), "it is an empty file (0 bytes)"),
    "random": (lambda path, data: path.write_bytes(random.Random(0).randbytes(4096)), "it is corrupt or not a PyTorch"),
    # anywhere: a zip's end record is last
    "truncated": (lambda path, data: path.write_bytes(data[: len(data) // 2]), "it is truncated: torch.save's zip"),
    "zip": (lambda path, data: zipfile.ZipFile(path, "w").close(), "it is corrupt or not a PyTorch file"),  # empty
    # protocol 4: torch's safe unpickler warns, and printed it under the refusal
    "pickle": (lambda path, data: path.write_bytes(pickle.dumps({"w": [1.0]}, protocol=4)), "it is corrupt or not a"),
    "not_checkpoint": (lambda path, data: torch.save({"w": torch.zeros(2)}, path), "is not a checkpoint of this"),
    "code": (
        lambda path, data: torch.save({"G": RunsCode(path.parent / "pwned"), "D": {}, "step": 0, "config": {}}, path),
        "Refused to load |it names posix.system",
    ),
}


# every entry typed where a checkpoint is read, for train.py and evaluate.py alike (gan/checkpoint.py)
def _retyped(state: dict, entry: str, dtype: torch.dtype) -> None:
    state[entry] = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state[entry].items()}


def updated(**entries: object) -> Callable[[dict], None]:
    return lambda state: state.update(entries)


def _group(entry: str, **settings: object):
    return lambda state: state[entry]["param_groups"][0].update(settings)


def poison(state: dict[str, Any], entry: str, key: str, slot: str = "", value: float = math.nan) -> None:
    """state[entry][key] (an optimizer's: its parameter `key`'s `slot`) filled with `value`."""
    (state[entry]["state"][key][slot] if slot else state[entry][key]).fill_(value)


SN_U = "features.2.parametrizations.weight.0._u"  # the default D's spectral norm: a power-iteration vector (a buffer)
NONFINITE = [("G", "net.0.weight", ""), ("D", SN_U, ""), ("G_ema", "module.net.1.running_mean", "")]  # a tensor, or
NONFINITE += [("opt_g", 0, "exp_avg"), ("opt_d", 3, "exp_avg_sq")]  # an Adam moment (its parameter's index, its slot)
POSITIONS = [{"epoch": -1, "batch": 2}, {"epoch": 0, "batch": -3}, {"epoch": 0, "batch": "3"}]  # no run reaches these
POSITIONS += [{"epoch": 0.0, "batch": 4}, {"epoch": False, "batch": 4}, {"epoch": 0}, [0, 4]]
POSITIONS += [{"epoch": 3, "batch": 4}, {"epoch": 0, "batch": 10**9}]  # beyond the step: 6 steps take 6 batches
PLAIN = [("threads", "2"), ("pack", 5), ("best", "7.5"), ("environment", [1]), ("kind", 3), ("G_ema", 7)]
PLAIN += [("num_classes", "x"), *(("step", v) for v in ("abc", 1.5, -3, True))]  # entries of the wrong type
TYPED = {  # an edit of a trained checkpoint -> what the refusal says (the shared load, then the resume gate)
    "G booleans": (lambda s: _retyped(s, "G", torch.bool), "entry 'G' is damaged: 'net.0.weight' holds torch.bool"),
    "G_ema ints": (lambda s: _retyped(s, "G_ema", torch.int32), "entry 'G_ema' is damaged: 'module.net.0.weight' hol"),
    "D booleans": (lambda s: _retyped(s, "D", torch.bool), "entry 'D' is damaged: 'features.0.bias' holds torch.bool"),
    "betas as text": (_group("opt_g", betas=("a", 0.9)), "param_groups[0].betas holds ('a', 0.9) (tuple), where Adam"),
    "eps None": (_group("opt_d", eps=None), "param_groups[0].eps holds None (NoneType), where Adam takes a number"),
    "lr as text": (_group("opt_g", lr="0.1"), "param_groups[0].lr holds '0.1' (str), where Adam takes a number"),
    "amsgrad 1": (_group("opt_d", amsgrad=1), "param_groups[0].amsgrad holds 1 (int), where Adam takes True or False"),
    **{f"{e}={v!r}": (updated(**{e: v}), f"entry '{e}' is damaged: it holds {v!r} ({type(v).__name__})")
       for e, v in PLAIN},
    **{f"data={data!r}": (updated(data=data), "its entry 'data' is damaged") for data in POSITIONS},
    "opt_g missing": (lambda s: s.pop("opt_g"), "its entry 'opt_g' is missing"),
    "opt_d groups as text": (updated(opt_d={"state": {}, "param_groups": "x"}), "its entry 'opt_d' is damaged"),
    **{f"{entry} {key} {slot} {value}": (
        lambda s, at=(entry, key, slot), value=value: poison(s, *at, value=value),
        f"NaN or inf in 1 of its |({entry}.{f'state[{key}].{slot}' if slot else key}). The checkpoint is damaged",
    ) for entry, key, slot in NONFINITE for value in (math.nan, math.inf)},
}  # fmt: skip


@pytest.mark.parametrize("kind", [*BAD, *TYPED])
def test_bad_checkpoint_is_refused(tiny_run, tmp_path, kind):
    """Where it is read, in one line naming the file, with no warning printed and no code run."""
    path, last = tmp_path / "last.pt", tiny_run / "checkpoints" / "last.pt"
    if kind in BAD:
        write, says = BAD[kind]
        write(path, last.read_bytes())
    else:
        (edit, says), state = TYPED[kind], torch.load(last, weights_only=True)
        edit(state)
        torch.save(state, path)
    with pytest.raises(CheckpointError) as caught, warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")  # as a shell would print them, not pytest's summary
        require_training_state(load_checkpoint(path), path)
    message = str(caught.value)  # `|`: the parts it holds, in order
    assert str(path) in message and re.search(".*".join(map(re.escape, says.split("|"))), message), message
    assert "\n" not in message and not shown, [str(w.message) for w in shown]
    assert ("arbitrary code" in message) == (kind == "code") and not (tmp_path / "pwned").exists()  # never ran
    # alone in its folder, the message says there is no other checkpoint, and does not invent one
    assert kind in ("missing", "not_checkpoint", "code") or "No numbered copy (step_NNNNNN.pt) is kept" in message


# damaged files and entries: one paragraph naming the file, for train.py's resume and evaluate.py alike
def state_of(run_dir: Path) -> dict[str, Any]:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def stored(group: str, key: str, value: object) -> Callable[[dict], object]:
    return lambda state: state["config"][group].__setitem__(key, value)


RNG = {"python": (3, (1, 2), None), "torch": torch.zeros(3, dtype=torch.uint8), "cuda": []}
# trainer.keep_checkpoints=2 kept these two alone (step_000002.pt dropped); test_longer reads what one holds
NEWEST = "Checkpoints are kept beside it (step_000006.pt, step_000004.pt): resume from {run}/checkpoints/step_000006.pt"
DAMAGED_ENTRIES = {  # program, what is done to last.pt (or a BAD file: one line in all), what is said (|: each part)
    "resume: truncated": ("train.py", "truncated", "Cannot read {path}: it is truncated: torch.save's zip archive"),
    "evaluate: code": ("evaluate.py", "code", "Refused to load {path}: it names posix.system"),
    "resume: rng": ("train.py", updated(rng=RNG), "entry 'rng' is missing or damaged"),
    "resume: fixed_z": ("train.py", updated(fixed_z=torch.zeros(5)), "entry 'fixed_z' is missing or damaged"),
    "evaluate: data.image_size": ("evaluate.py", stored("data", "image_size", [16]), "is damaged: data.image_size"),
    # the file's fault, not this command's: its copies are named (not a config diff against the command line)
    "resume: model.g_width": ("train.py", stored("model", "g_width", "wide"),
                              "{path}: its entry 'config' is damaged: model.g_width"),
    "resume: inf in D": ("train.py", lambda state: poison(state, "D", SN_U, value=math.inf),  # damage, not a high lr
                         f"Cannot resume from {{path}}: it holds NaN or inf in 1 of its|(D.{SN_U})|{NEWEST}"),
}  # fmt: skip


@pytest.mark.parametrize(("program", "damage", "said"), DAMAGED_ENTRIES.values(), ids=DAMAGED_ENTRIES)
def test_a_damaged_checkpoint_ends_resume_and_evaluate_in_one_paragraph(good_run, tmp_path, program, damage, said):
    run_dir = shutil.copytree(good_run, tmp_path / "run")  # plain copies: last.pt and its numbered twin apart
    path, out, state = run_dir / "checkpoints" / "last.pt", tmp_path / "out", state_of(run_dir)
    if isinstance(damage, str):
        BAD[damage][0](path, path.read_bytes())
    else:
        damage(state)
        torch.save(state, path)  # not save_checkpoint: a damaged file as another program would leave it
    before = snapshot(run_dir / "checkpoints")
    if program == "train.py":
        result = run_train(f"trainer.resume={path}", "trainer.max_steps=8", f"hydra.run.dir={out}")
    else:
        result = run_evaluate("device=cpu", "threads=1", f"checkpoint={path}", f"hydra.run.dir={out}")
    output = output_of(result)
    assert result.returncode == 2 and (len(output.strip().splitlines()) == 1 or callable(damage)), output[-3000:]
    assert all(part.format(path=path, run=run_dir) in output for part in said.split("|")), output[-3000:]
    words = ("Traceback", "another version", "this command changes")  # damage: not a crash, not another version,
    words += ("Lower optim.lr", "last good one", "Non-finite loss")  # nor a run that diverged while training
    assert not any(word in output for word in words) and (program == "train.py" or str(path) in output)  # evaluate.py
    assert not (out / "checkpoints").exists() and not (out / "metrics.json").exists()
    assert snapshot(run_dir / "checkpoints") == before
    assert not (run_dir / "checkpoints" / "pwned").exists()  # the crafted pickle's code never ran


DAMAGED_CONFIGS: dict[str, tuple[Callable[[dict], object], str]] = {
    "not a mapping": (lambda c: 5, "it is 5 (int), not a mapping of groups"),
    "a group replaced by a number": (lambda c: {**c, "model": 5}, "its group 'model' is 5 (int)"),
    "a group missing": (lambda c: {k: v for k, v in c.items() if k != "optim"}, "it has no 'optim' group"),
    "a wrongly typed value": (lambda c: {**c, "model": {**c["model"], "z_dim": "abc"}}, "model.z_dim: Value 'abc'"),
    "an unknown value type": (lambda c: {**c, "trainer": {**c["trainer"], "seed": torch.zeros(2)}},
                              "trainer.seed: Value 'Tensor' is not a supported primitive type"),
    "a bool that is none": (lambda c: {**c, "model": {**c["model"], "conditional": "maybe"}}, "model.conditional"),
    # an unknown key may be another version's, or an edit
    "an unknown key": (lambda c: {**c, "model": {**c["model"], "num_classes": "x"}}, "model.num_classes is not a"),
}  # fmt: skip


@pytest.mark.parametrize("case", DAMAGED_CONFIGS)
def test_a_damaged_stored_config_is_called_damaged_not_another_version(good_run, tmp_path, case):
    damage, detail = DAMAGED_CONFIGS[case]
    source = tmp_path / "last.pt"
    with pytest.raises(CheckpointError) as caught:
        stored_config(damage(state_of(good_run)["config"]), source)
    message, unknown = str(caught.value), case == "an unknown key"
    assert detail in message and "this command" not in message and "\n" not in message
    assert (f"Cannot use {source}: its entry 'config' is damaged: " in message) != unknown
    assert ("does not fit this version's settings" in message and "another version" in message) == unknown


@pytest.mark.parametrize("kept", [None, "best.pt", "step_000006.pt"], ids=["nothing", "best.pt", "a numbered copy"])
def test_a_folder_without_last_pt_names_where_it_looked_and_the_checkpoint_it_holds(tiny_run, tmp_path, kept):
    # trainer.resume=DIR and evaluate.py's checkpoint=DIR both read the checkpoint through this
    run_dir = tmp_path if kept is None else shutil.copytree(tiny_run, tmp_path / "run")
    if kept:
        (run_dir / "checkpoints" / "last.pt").rename(run_dir / "checkpoints" / kept)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(run_dir)
    message = str(caught.value)
    assert message.startswith(f"Checkpoint not found: {run_dir} (looked for {run_dir / 'checkpoints' / 'last.pt'})")
    assert (kept is None or kept in message) and ("evaluate.py checkpoint=" in message) == (kept == "best.pt")


RETYPED = {  # entry, how its first weight (or moment) is changed, what the message says
    # a weight not a float at all: TYPED, as the checkpoint is read; build_generator reads the generator alike
    "a float64 EMA weight": ("G_ema", lambda t: t.double(), "torch.float64 in the checkpoint, torch.float32"),
    "an integer Adam moment": ("opt_d", lambda t: t.long(), "holds torch.int64, where Adam keeps floats"),
    "a moment of another shape": ("opt_g", lambda t: t.flatten()[:3].clone(), "has shape (3,), where its parameter"),
    "a sliced G weight": ("G", lambda t: t[:1].clone(), ": (1, 16, 4, 4) in the checkpoint, (16, 16, 4, 4) in"),
}


@pytest.mark.parametrize("entry, change, said", RETYPED.values(), ids=RETYPED)
def test_a_checkpoint_tensor_of_another_type_or_shape_is_refused_naming_it(tiny_run, tmp_path, entry, change, said):
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    holder = state[entry]["state"][0] if entry.startswith("opt") else state[entry]  # an Adam moment, or a weight
    key = "exp_avg" if entry.startswith("opt") else next(key for key in holder if "weight" in key)
    holder[key] = change(holder[key])
    named = f"state[0].{key}" if entry.startswith("opt") else key
    torch.save(state, run_dir / "checkpoints" / "last.pt")
    with pytest.raises(CheckpointError) as caught:
        train(compose_config(f"trainer.resume={run_dir}", "trainer.max_steps=8"), run_dir)
    assert named in str(caught.value) and said in str(caught.value)
    if entry in ("G", "G_ema"):  # evaluate.py reads the generator it samples from alike
        with pytest.raises(CheckpointError) as caught:
            build_generator(state, use_ema=entry == "G_ema", device=torch.device("cpu"), source="altered.pt")
        assert named.removeprefix("module.") in str(caught.value) and said in str(caught.value)
