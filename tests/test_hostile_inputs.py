"""Hostile but realistic input that no other test file tries: values at the edge of a setting's range,
wrong types and choices Hydra refuses, datasets that are garbage, a folder too small for one batch, the
spellings of a run's folder a new run must still see through, where `trainer.resume=auto` looks, and a
few command lines whose quoting or interpolation is the point. A case another test file checks is not
repeated here.

Each refusal is tested where it is raised, in process; the command line only where it is the point.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from conftest import CONFIG_DIR, compose_config, run_evaluate, run_script, run_train
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from PIL import Image
from tensorboard.compat.tensorflow_stub.io.gfile import LocalFileSystem

from gan.checkpoint import load_checkpoint
from gan.config import ClassifierConfig, EvaluateConfig, MetricsConfig, register_evaluate_configs, to_plain
from gan.data import load_dataset
from gan.device import resolve_device
from gan.errors import CheckpointError, ConfigError, DataError, RunDirError, environment_error
from gan.evaluation.pipeline import build_generator, evaluate
from gan.launch import resume_auto
from gan.run import Run
from gan.training import train
from gan.training.monitor import Monitor
from train import what_is_kept

CPU = torch.device("cpu")
register_evaluate_configs()


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder`, hidden ones too, by relative path -> sha256 of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def output_of(result) -> str:
    return result.stdout + result.stderr


@pytest.fixture
def trained(tiny_run) -> Path:
    """The session's finished debug=tiny run (6 steps); tests copy it before writing."""
    assert load_checkpoint(tiny_run)["step"] == 6
    return tiny_run


def copy_run(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to)
    return to


# 1. values Hydra refuses: a wrong type, a choice that is not one -----------------------------------

HYDRA_REFUSED = {  # override -> (the key Hydra's error names, the value it quotes)
    "max_steps float": ("trainer.max_steps=1.5", "trainer.max_steps", "1.5"),
    "precision typo": ("trainer.precision=fp64", "trainer.precision", "fp64"),
    "diffaugment policy": ("model.diffaugment=[rotate]", "model.diffaugment", "rotate"),
}


@pytest.mark.parametrize("case", HYDRA_REFUSED)
def test_hydra_refuses_a_wrong_type_or_choice_naming_the_key_and_the_value(case):
    override, key, value = HYDRA_REFUSED[case]
    with pytest.raises(ConfigCompositionException) as caught:
        compose_config(override)
    cause = caught.value.__cause__  # OmegaConf's error, which Hydra prints under its own line
    assert override in str(caught.value)
    assert str(getattr(cause, "full_key", "")).startswith(key) and f"'{value}'" in str(cause)


def test_evaluate_refuses_a_sample_count_that_is_no_number_naming_it():
    GlobalHydra.instance().clear()
    with pytest.raises(ConfigCompositionException) as caught:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            compose(config_name="evaluate", overrides=["checkpoint=x.pt", "num_samples=abc"])
    assert getattr(caught.value.__cause__, "full_key", None) == "num_samples" and "'abc'" in str(caught.value.__cause__)


# 2. the edge of a range: refused on the wrong side, accepted just inside -------------------------

EDGES = {  # the refused override(s), an accepted neighbour, the key=value the message opens with
    "max_steps 0": (["trainer.max_steps=0"], ["trainer.max_steps=1"], "trainer.max_steps=0"),
    "beta1 1.0": (["optim.beta1=1.0"], ["optim.beta1=0.99"], "optim.beta1=1.0"),
    "ema_decay 1.0": (["model.ema_decay=1.0"], ["model.ema_decay=0.9999"], "model.ema_decay=1.0"),
    "real_label 0.3": (["loss.real_label=0.3"], ["loss.real_label=0.9"], "loss.real_label=0.3"),
    "real_label 0.5": (["loss.real_label=0.5"], ["loss.real_label=0.51"], "loss.real_label=0.5"),
    "eval_samples 5": (
        ["trainer.eval_every=3", "trainer.eval_samples=5"],
        ["trainer.eval_every=3", "trainer.eval_samples=10"],
        "trainer.eval_samples=5",
    ),
}


@pytest.mark.parametrize("case", EDGES)
def test_a_value_just_outside_a_range_is_refused_naming_the_key_and_the_one_inside_is_kept(case):
    refused, accepted, named = EDGES[case]
    with pytest.raises(ConfigError) as caught:
        compose_config(*refused)
    assert str(caught.value).startswith(named + " ")
    key, value = accepted[-1].split("=")
    assert str(OmegaConf.select(OmegaConf.structured(compose_config(*accepted)), key)) == value


@pytest.mark.parametrize("key", ["trainer.device", "device"])
def test_a_cuda_index_beyond_the_visible_devices_is_refused_naming_the_setting(monkeypatch, key):
    # spelled right (check_device_name lets cuda:N through): only the machine can say no
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=re.escape(f"{key}='cuda:99' but only 1 CUDA device(s) are visible")):
        resolve_device("cuda:99", key)
    assert resolve_device("cuda:0", key) == torch.device("cuda", 0)


# 3. datasets that are garbage, or too small ------------------------------------------------------


def test_an_mnist_file_whose_header_announces_more_than_it_holds_is_refused_naming_it(tmp_path):
    # a download cut short: the four names, each the IDX magic and a few bytes; the header's sizes
    # multiply to about 6e20 bytes, which must be read as damage, not allocated
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        (raw / name).write_bytes(b"\x00\x00\x08\x03" + bytes(range(40)))
    with pytest.raises(DataError) as caught:
        load_dataset(compose_config("data=mnist", f"data.root={tmp_path}").data)
    message = str(caught.value)
    assert f"{raw / 'train-images-idx3-ubyte'} is truncated" in message and "data.download=true" in message


def fill_junk(folder: Path) -> None:
    (folder / "readme.txt").write_text("no images here\n")
    (folder / "broken.png").write_bytes(b"this is not a png")  # an image by its name only


@pytest.mark.parametrize("fill", [lambda folder: None, fill_junk], ids=["empty", "a text file and a fake png"])
def test_a_folder_without_a_usable_image_is_refused_naming_the_folder(tmp_path, fill):
    folder = tmp_path / "images"
    folder.mkdir()
    fill(folder)
    with pytest.raises(DataError) as caught:
        load_dataset(compose_config("data=folder", f"data.root={folder}").data)
    assert str(folder) in str(caught.value) and "data=folder" in str(caught.value)


def test_a_folder_smaller_than_one_batch_stops_training_before_anything_is_written(tmp_path):
    folder = tmp_path / "three"
    folder.mkdir()
    for i in range(3):
        Image.new("RGB", (20, 20), (40 * i, 80, 120)).save(folder / f"img{i}.png")
    run_dir = tmp_path / "run"
    with pytest.raises(DataError) as caught:
        train(compose_config("data=folder", f"data.root={folder}"), run_dir)
    assert "fewer than data.batch_size=32" in str(caught.value)  # debug=tiny's batch
    assert not run_dir.exists() or not any(path.is_file() for path in run_dir.rglob("*"))


# 4. checkpoints: a folder without one, a damaged BatchNorm statistic, a resume with nothing to do --


def test_a_folder_without_a_checkpoint_is_refused_naming_where_it_looked(tmp_path):
    # trainer.resume=DIR and evaluate.py's checkpoint=DIR both read the checkpoint through this
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(tmp_path)
    message = str(caught.value)
    assert f"Checkpoint not found: {tmp_path} (looked for {tmp_path / 'checkpoints' / 'last.pt'})" in message


def test_an_empty_checkpoint_path_is_refused_not_read_as_the_launch_directory(trained, tmp_path):
    # Path("") is ".": a checkpoints/last.pt where the command runs would be evaluated unasked
    copy_run(trained, tmp_path / "here")
    result = run_evaluate("checkpoint=", f"hydra.run.dir={tmp_path / 'eval'}", cwd=tmp_path / "here")
    assert result.returncode == 2 and "checkpoint path is empty (an unset shell variable?)" in output_of(result)
    assert not (tmp_path / "eval").exists()
    with pytest.raises(CheckpointError, match="The checkpoint path is empty"):  # gan.load_generator(""), resume
        load_checkpoint("")


def test_a_pickle_of_another_program_is_refused_in_one_line(tmp_path):
    # pickle protocol 4: torch's safe unpickler warns about it, and the warning printed under the refusal
    (tmp_path / "model.pt").write_bytes(pickle.dumps({"weights": [1.0]}, protocol=4))
    with warnings.catch_warnings(record=True) as shown:  # as a shell would print them, not pytest's summary
        warnings.simplefilter("always")
        result = run_evaluate(f"checkpoint={tmp_path / 'model.pt'}", f"hydra.run.dir={tmp_path / 'eval'}")
    assert result.returncode == 2 and "model.pt" in output_of(result)
    assert len(output_of(result).strip().splitlines()) == 1 and not shown, [str(w.message) for w in shown]


@pytest.mark.parametrize("use_ema", [False, True], ids=["G", "G_ema"])
def test_a_nan_in_a_batchnorm_statistic_alone_is_refused_by_evaluate(trained, use_ema):
    # the statistics are buffers, not weights: evaluate.py with bn_batches=0 would sample with them
    state = torch.load(trained / "checkpoints" / "last.pt", weights_only=True)
    entry = "G_ema" if use_ema else "G"
    key = next(k for k in state[entry] if k.endswith("running_var"))
    state[entry][key][0] = float("nan")
    with pytest.raises(CheckpointError) as caught:
        build_generator(state, use_ema=use_ema, device=CPU, source="damaged.pt")
    assert "holds NaN or inf in 1 of its" in str(caught.value) and key.removeprefix("module.") in str(caught.value)
    assert build_generator(state, use_ema=not use_ema, device=CPU)[1] == ("raw" if use_ema else "EMA")


def test_a_resume_already_at_max_steps_trains_nothing_and_is_no_error(trained, tmp_path):
    run_dir = copy_run(trained, tmp_path / "run")
    before = load_checkpoint(run_dir)
    result = train(compose_config(f"trainer.resume={run_dir}", "trainer.max_steps=6"), run_dir)
    after = load_checkpoint(run_dir)
    assert result.step == after["step"] == 6
    assert all(torch.equal(before["G"][key], after["G"][key]) for key in before["G"])


# 5. run folders: a new run sees the run however its folder is spelled ---------------------------

SPELLINGS = {  # how the folder of the run at tmp/runs/a is named
    "dot-dot": lambda tmp: tmp / "runs" / "a" / ".." / "a",
    "relative": lambda tmp: Path("runs/a"),
    "symlink": lambda tmp: tmp / "link_to_a",
}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_new_run_is_refused_over_a_run_however_its_folder_is_spelled(trained, tmp_path, monkeypatch, spelling):
    run_dir = copy_run(trained, tmp_path / "runs" / "a")
    (tmp_path / "link_to_a").symlink_to(run_dir, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    before = snapshot(run_dir)
    named = SPELLINGS[spelling](tmp_path)
    with pytest.raises(RunDirError) as caught:
        train(compose_config("trainer.max_steps=1"), named)
    assert str(caught.value).startswith(f"{named} already holds a run")
    assert snapshot(run_dir) == before  # its lock came and went; nothing else was written


# 6. trainer.resume=auto: where it looks ------------------------------------------------------------

PLACES = {  # where the run lies under outputs/, and whether its .hydra/overrides.yaml survives
    "a sweep's job folder": ("sweep/0_optim.lr=0.002", True),
    "a run whose overrides.yaml is lost": ("runs/a", False),
}


@pytest.mark.parametrize("place", PLACES)
def test_resume_auto_finds_the_matching_run_wherever_it_lies_under_outputs(trained, tmp_path, place):
    where, overrides = PLACES[place]
    run_dir = copy_run(trained, tmp_path / "outputs" / where)
    record = run_dir / ".hydra"
    record.mkdir(exist_ok=True)
    (record / "config.yaml").write_text(OmegaConf.to_yaml(to_plain(compose_config())))
    (record / "overrides.yaml").unlink(missing_ok=True)
    if overrides:
        (record / "overrides.yaml").write_text("- debug=tiny\n- trainer.threads=1\n")
    outputs, fresh = tmp_path / "outputs", tmp_path / "new"
    wanted = to_plain(compose_config("trainer.threads=2", "trainer.max_steps=9"))  # runtime keys differ
    assert resume_auto(wanted, fresh, outputs) == run_dir / "checkpoints" / "last.pt"
    assert resume_auto(to_plain(compose_config("loss=hinge")), fresh, outputs) is None  # another run's settings


# 7. evaluate.py reads a run and writes only into its own folder -----------------------------------


def test_evaluating_a_run_leaves_every_file_of_it_as_it_was(trained, tmp_path, one_thread):
    run_dir = copy_run(trained, tmp_path / "run")
    before = snapshot(run_dir)
    metrics = MetricsConfig(kid_subsets=2, kid_subset_size=32, classifier=ClassifierConfig(min_accuracy=0))
    cfg = EvaluateConfig(
        checkpoint=str(run_dir),
        num_samples=32,
        bn_batches=2,
        grid_samples=16,
        interpolation_rows=2,
        neighbour_queries=2,
        device="cpu",
        threads=1,
        metrics=metrics,
    )
    cfg.check()
    evaluate(cfg, tmp_path / "eval", {"root": str(tmp_path / "data")})  # the classifier is cached there
    assert (tmp_path / "eval" / "metrics.json").is_file()
    assert snapshot(run_dir) == before


# 8. the command line, where its quoting or its interpolation is the point ------------------------


def test_a_new_run_into_a_run_named_through_an_interpolation_is_refused(trained, tmp_path):
    run_dir = copy_run(trained, tmp_path / "runs" / "interp_7")
    before = snapshot(run_dir)
    result = run_train("trainer.seed=7", f"hydra.run.dir={tmp_path / 'runs'}/interp_${{trainer.seed}}", cwd=tmp_path)
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"{run_dir} already holds a run" in output and "Traceback" not in output
    assert snapshot(run_dir) == before


def test_a_new_run_into_a_quoted_folder_with_a_space_and_an_equals_sign_is_refused(trained, tmp_path):
    run_dir = copy_run(trained, tmp_path / "my runs" / "0_optim.lr=0.002")  # a sweep job's name, moved
    before = snapshot(run_dir)
    result = run_train(f"hydra.run.dir='{run_dir}'", cwd=tmp_path)
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"{run_dir} already holds a run" in output and "Traceback" not in output
    assert snapshot(run_dir) == before


def test_a_resume_given_a_bare_path_with_a_space_continues_the_run_in_place(trained, tmp_path):
    run_dir = copy_run(trained, tmp_path / "my run")
    result = run_train(f"trainer.resume={run_dir}", "trainer.max_steps=8", cwd=tmp_path)
    assert result.returncode == 0, output_of(result)[-3000:]
    assert load_checkpoint(run_dir)["step"] == 8
    assert not any((tmp_path / "outputs").rglob("*"))  # no folder of its own: the run went on in place


def test_a_resume_given_a_relative_path_to_the_checkpoint_file_continues_its_run_in_place(trained, tmp_path):
    run_dir = copy_run(trained, tmp_path / "outputs" / "runs" / "a")
    result = run_train("trainer.resume=outputs/runs/a/checkpoints/last.pt", "trainer.max_steps=8", cwd=tmp_path)
    assert result.returncode == 0, output_of(result)[-3000:]
    assert [p.parent.parent for p in (tmp_path / "outputs").rglob("last.pt")] == [run_dir]
    assert load_checkpoint(run_dir)["step"] == 8


# 9. a resume whose outputs cannot take a write: refused before it writes, naming the path --------

DAMAGED_OUTPUTS = {  # what is done to the run's folder -> (the path named, what the message says of it)
    "samples/ is a file": ("samples", "file", "it is a file, where the run keeps a folder of its sample grids"),
    "tb/ is a file": ("tb", "file", "it is a file, where the run keeps a folder of its TensorBoard events"),
    "eval/ is a file": ("eval", "file", "it is a file, where the run keeps a folder of its final evaluation"),
    "a grid to come is a folder": ("samples/step_000008.png", "folder", "it is a folder, where the run writes a file"),
    "best.pt is a folder": ("checkpoints/best.pt", "folder", "it is a folder, where the run writes a file"),
    "config.yaml is a folder": (".hydra/config.yaml", "folder", "it is a folder, where the run writes a file"),
    "the log is a folder": ("train.log", "folder", "it is a folder, where the run writes a file"),
}


@pytest.mark.parametrize("case", DAMAGED_OUTPUTS)
def test_a_resume_whose_outputs_cannot_take_a_write_is_refused_naming_the_path_and_changes_nothing(
    trained, tmp_path, case
):
    where, becomes, said = DAMAGED_OUTPUTS[case]
    run_dir = copy_run(trained, tmp_path / "run")
    path = run_dir / where
    if path.is_dir():
        shutil.rmtree(path)
    path.unlink(missing_ok=True)
    if becomes == "file":
        path.write_text("not a folder\n")
    else:
        path.mkdir()
    before = snapshot(run_dir)
    result = run_train(f"trainer.resume={run_dir}", "trainer.max_steps=8", cwd=tmp_path)
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"Cannot write {path}: {said}" in output and "Nothing was written" in output
    assert "Traceback" not in output and "Free disk space" not in output
    assert snapshot(run_dir) == before  # record, log, events, grids and checkpoint as they were
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no folder of its own either


def test_a_damaged_old_grid_is_left_out_of_the_animation_and_the_resume_goes_on(trained, tmp_path):
    run_dir = copy_run(trained, tmp_path / "run")
    damaged = run_dir / "samples" / "step_000003.png"
    damaged.write_bytes(b"not a png any more")
    result = run_train(f"trainer.resume={run_dir}", "trainer.max_steps=9", cwd=tmp_path)
    output = output_of(result)
    assert result.returncode == 0, output[-3000:]
    assert f"Left {damaged} out of progress.gif: it cannot be read as an image" in output
    assert damaged.read_bytes() == b"not a png any more"  # a grid of a step past the checkpoint is never rewritten
    with Image.open(run_dir / "samples" / "progress.gif") as gif:
        assert gif.n_frames == 2  # steps 6 and 9


def test_a_resume_that_dies_before_its_first_write_leaves_record_log_and_events_as_they_were(trained, tmp_path):
    # the first step's update is not finite (optim.lr=1e39, tunable on resume): caught at the first log, before
    # any event, grid or checkpoint, so the record (which would hold the new rate and max_steps) is not written
    run_dir = copy_run(trained, tmp_path / "run")
    before = snapshot(run_dir)
    result = run_train(
        f"trainer.resume={run_dir}", "trainer.max_steps=9", "optim.lr=1e39", "optim.lr_d=1e39", cwd=tmp_path
    )
    assert result.returncode == 3, output_of(result)[-3000:]
    assert snapshot(run_dir) == before


FULL_DISKS = {  # where the disk is full when the resume writes -> what the paragraph says
    "the record": (".hydra/.config.yaml.", "No space left on device (errno 28). Free disk space, then resume: "),
    "the grids' folder": ("samples/.write-test-", "samples: this folder of its sample grids refuses a new file"),
}


@pytest.mark.parametrize("where", FULL_DISKS)
def test_a_disk_that_fills_as_a_resume_writes_leaves_the_run_as_it_was_and_no_temporary_file(
    trained, tmp_path, monkeypatch, where
):
    run_dir = copy_run(trained, tmp_path / "run")
    before = snapshot(run_dir)
    fsync, full, said = os.fsync, *FULL_DISKS[where]

    def no_room_there(fd: int) -> None:  # the blocks of a file written there find no room
        if f"/{full}" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", no_room_there)
    result = run_train(f"trainer.resume={run_dir}", "trainer.max_steps=8", cwd=tmp_path)
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert said in output and "Traceback" not in output
    if where == "the record":
        assert f"{run_dir / 'checkpoints' / 'last.pt'} holds step 6" in output
    assert snapshot(run_dir) == before  # no temporary file in .hydra/, no log, no events


# 11. checkpoint tensors of another type or shape than the model's ------------------------------

RETYPED = {  # entry, how its first weight (or moment) is changed, what the message says
    # not a float at all: refused as the checkpoint is read (gan/checkpoint.py), and by build_generator alike
    "an integer G weight": ("G", lambda t: t.to(torch.int32), "torch.int32"),
    "a complex G weight": ("G", lambda t: t.to(torch.complex64), "torch.complex64"),
    "a float64 D weight": ("D", lambda t: t.double(), "torch.float64 in the checkpoint, torch.float32"),
    "an integer EMA weight": ("G_ema", lambda t: t.long(), "torch.int64"),
    "an integer Adam moment": ("opt_d", lambda t: t.long(), "holds torch.int64, where Adam keeps floats"),
    "a moment of another shape": ("opt_g", lambda t: t.flatten()[:3].clone(), "has shape (3,), where its parameter"),
}


@pytest.mark.parametrize("case", RETYPED)
def test_a_checkpoint_tensor_of_another_type_or_shape_is_refused_naming_it(trained, tmp_path, case):
    entry, change, said = RETYPED[case]
    run_dir = copy_run(trained, tmp_path / "run")
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    if entry.startswith("opt"):
        slots = state[entry]["state"][0]
        slots["exp_avg"] = change(slots["exp_avg"])
        named = "state[0].exp_avg"
    else:
        named = next(key for key in state[entry] if "weight" in key)
        state[entry][named] = change(state[entry][named])
    torch.save(state, run_dir / "checkpoints" / "last.pt")
    with pytest.raises(CheckpointError) as caught:
        train(compose_config(f"trainer.resume={run_dir}", "trainer.max_steps=8"), run_dir)
    assert named in str(caught.value) and said in str(caught.value)
    if entry in ("G", "G_ema"):  # evaluate.py reads the generator it samples from alike
        with pytest.raises(CheckpointError) as caught:
            build_generator(state, use_ema=entry == "G_ema", device=CPU, source="altered.pt")
        assert named.removeprefix("module.") in str(caught.value) and said in str(caught.value)


# 12. messages: what the folder holds instead, a truncated file, k beyond the real images --------


@pytest.mark.parametrize("kept", ["best.pt", "step_000006.pt"])
def test_a_run_folder_without_last_pt_names_the_checkpoint_it_holds_and_its_use(trained, tmp_path, kept):
    run_dir = copy_run(trained, tmp_path / "run")
    (run_dir / "checkpoints" / "last.pt").rename(run_dir / "checkpoints" / kept)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(run_dir)
    message = str(caught.value)
    assert message.startswith(f"Checkpoint not found: {run_dir}") and kept in message
    assert ("evaluate.py checkpoint=" in message) == (kept == "best.pt")  # best.pt: G alone, no resume


@pytest.mark.parametrize("kept", [0.1, 0.5, 0.99])
def test_a_checkpoint_cut_short_anywhere_is_called_truncated(trained, tmp_path, kept):
    data = (trained / "checkpoints" / "last.pt").read_bytes()
    cut = tmp_path / "last.pt"
    cut.write_bytes(data[: int(len(data) * kept)])
    with pytest.raises(CheckpointError, match=f"{cut}: it is truncated: torch.save's zip archive cut short at"):
        load_checkpoint(cut)


@pytest.mark.parametrize(
    "setting, named", [("metrics.pr_k=1000", "metrics.pr_k=1000"), ("metrics.dc_k=500", "metrics.dc_k=500")]
)
def test_a_neighbour_count_beyond_the_real_images_is_refused_in_one_paragraph(trained, tmp_path, setting, named):
    # num_samples (10,000 by default) is enough: the held-out split of the tiny digits (42 images) is not
    result = run_evaluate(f"checkpoint={trained}", setting, "threads=1", f"data.root={tmp_path}", cwd=tmp_path)
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"{named} needs more than" in output and "holds 42" in output and "Traceback" not in output


def test_a_neighbour_count_beyond_num_samples_is_refused_naming_both():
    cfg = EvaluateConfig(checkpoint="x.pt", num_samples=10, metrics=MetricsConfig(pr_k=10))
    with pytest.raises(ConfigError, match=r"num_samples=10 must exceed metrics.pr_k \(10\)"):
        cfg.check()


FAILED_WRITES = {  # the OSError, the file the message names, what it says to do
    "full disk, bytes path": (OSError(errno.ENOSPC, "No space left on device", b"/r/tb/ev"), "/r/tb/ev", "Free disk"),
    "read-only mount": (OSError(errno.EROFS, "Read-only file system", "/r/x"), "/r/x", "mounted read-only"),
    "file size limit": (OSError(errno.EFBIG, "File too large", "/r/c.pt"), "/r/c.pt", "ulimit -f"),
    "no permission": (PermissionError(errno.EACCES, "Permission denied", "/r/s"), "/r/s", "write permission"),
}


@pytest.mark.parametrize("case", FAILED_WRITES)
def test_a_failed_write_names_the_file_its_cause_and_what_to_do(case):
    err, named, fix = FAILED_WRITES[case]
    message = str(environment_error(err))
    assert message.startswith(f"Cannot use {named}: {err.strerror}") and fix in message and "b'" not in message


def test_a_full_disk_under_tensorboard_names_the_events_file_without_the_writer_threads_traceback(
    tmp_path, monkeypatch, capfd
):
    monitor = Monitor(tmp_path, 0, 10, progress=False)
    monitor.numbers(1, {"loss/d": 1.0})  # the events file opens at the first write

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")  # as gfile reports it: no file named

    monkeypatch.setattr(LocalFileSystem, "append", full)
    monitor.numbers(2, {"loss/d": 1.0})
    with pytest.raises(OSError) as caught:
        monitor.close()  # the writer thread's failure comes back here
    assert caught.value.filename == str(monitor.events) and monitor.events.parent == tmp_path / "tb"
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("written", [False, True])
def test_after_a_failed_write_train_py_says_whether_a_checkpoint_exists(trained, tmp_path, written):
    run_dir = copy_run(trained, tmp_path / "run")
    if not written:
        (run_dir / "checkpoints" / "last.pt").unlink()
    said = what_is_kept(run_dir)
    assert ("holds step 6" in said) == written and ("No checkpoint of this run was written" in said) != written


# 13. evaluate.py owns its folder ----------------------------------------------------------------


def test_an_evaluation_into_a_folder_another_holds_is_refused_naming_the_holder(trained, tmp_path):
    folder = tmp_path / "eval"
    with Run(folder).owned():
        result = run_evaluate(f"checkpoint={trained}", f"hydra.run.dir={folder}", "threads=1", cwd=tmp_path)
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"The run directory {folder} is in use: process {os.getpid()}" in output
    assert "it is training or evaluating there" in output
    assert list(folder.iterdir()) == []  # the holder's lock went with it; the refused evaluation wrote nothing


# 6. scripts the docs tell users to run, given arguments they cannot use --------------------------

BAD_SCRIPT_ARGUMENTS = {  # each was a traceback, after work: a benchmark's subprocess, or an empty median
    "bench --rounds 0": (["bench.py", "--rounds", "0"], "--rounds"),
    "bench --precisions fp64": (["bench.py", "--precisions", "fp64"], "invalid choice: 'fp64'"),
    "bench_parts --sizes 24": (["bench_parts.py", "--sizes", "24"], "--sizes powers of two"),
    "longer --plot without NAME=": (["longer.py", "--plot", "runs", "--out", "x.png"], "each run is NAME=DIR"),
}


@pytest.mark.parametrize("case", BAD_SCRIPT_ARGUMENTS)
def test_a_script_refuses_an_argument_it_cannot_use_before_it_works(case, tmp_path):
    args, says = BAD_SCRIPT_ARGUMENTS[case]
    result = run_script(*args, cwd=tmp_path)
    assert result.returncode == 2 and says in result.stderr and "Traceback" not in output_of(result)
    assert not any(tmp_path.iterdir())
