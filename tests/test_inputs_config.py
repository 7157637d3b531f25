"""Inputs a hostile but realistic user gives: thread counts beyond the machine, non-finite floats,
a minibatch-stddev group that does not divide the batch, a data.limit beyond the dataset, a file
where a folder belongs, damaged held-out files, and the stop a non-finite loss makes. Each is one
paragraph naming the key or file, exit code 2 where the run cannot go on, never a traceback."""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator, Optional

import conftest
import numpy as np
import pytest
import torch
from conftest import compose_config, run_train
from test_datasets import cfg_for, write_idx, write_image, write_mnist

import gan.core.losses
from gan.config import ConfigError, EvaluateConfig, TrainConfig
from gan.core.losses import LOSSES, AdversarialLoss
from gan.data import DataError, EmptySplitError, is_held_out, load_dataset
from gan.device import available_cpus
from gan.training import NonFiniteLossError, train
from gan.training.faults import NonFiniteWatch
from gan.training.overfit import build_probe

CPU = torch.device("cpu")


def output_of(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


def run_evaluate(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real `python evaluate.py` command line on the CPU, in process."""
    return conftest.run_evaluate("device=cpu", *overrides, cwd=cwd)


def assert_refused(result: subprocess.CompletedProcess, *expected: str, run_dir: Path | None = None) -> str:
    """Exit code 2, each expected text in the output, no traceback, and (for a training run) nothing
    written that a run writes: no checkpoint, no TensorBoard events."""
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    for text in expected:
        assert text in output, output[-3000:]
    if run_dir is not None:
        assert not (run_dir / "checkpoints").exists() and not (run_dir / "tb").exists()
    return output


# 1. threads beyond the CPUs this process may use ------------------------------------------------


@pytest.mark.parametrize("threads", [10**6, 2**40], ids=["1e6 (segfaulted)", "2^40 (overflowed)"])
def test_train_refuses_more_threads_than_cpus_naming_the_count(tmp_path, threads):
    run_dir = tmp_path / "run"
    result = run_train(f"trainer.threads={threads}", f"hydra.run.dir={run_dir}")
    cpus = available_cpus()
    assert_refused(
        result, f"trainer.threads={threads} is more than the {cpus} CPU(s) this process may use", run_dir=run_dir
    )


def test_evaluate_refuses_more_threads_than_cpus_before_reading_the_checkpoint(tmp_path):
    result = run_evaluate("checkpoint=nowhere.pt", "threads=1000000", cwd=tmp_path)
    assert_refused(result, f"threads=1000000 is more than the {available_cpus()} CPU(s)")


def test_the_thread_limit_is_this_machines_cpu_count():
    cpus = available_cpus()  # whatever the machine: the boundary is read from it, not assumed
    assert compose_config(f"trainer.threads={cpus}").trainer.threads == cpus
    with pytest.raises(ConfigError, match=rf"trainer\.threads={cpus + 1} is more than the {cpus} CPU"):
        compose_config(f"trainer.threads={cpus + 1}")
    with pytest.raises(ConfigError, match=rf"^threads={cpus + 1} is more than"):
        EvaluateConfig(checkpoint="x", threads=cpus + 1).check()


# 2. every float setting is finite ---------------------------------------------------------------


@pytest.mark.parametrize(
    "override",
    [
        "optim.lr_d=inf",  # passed `lr_d > 0` and reached training
        "optim.lr=nan",
        "loss.feature_matching=inf",  # passed `>= 0`
        "loss.r1=1e400",  # Hydra reads it as inf
        "model.ema_decay=nan",
        "model.ada_kimg=inf",
        "model.ema_kimg=-inf",
    ],
)
def test_a_non_finite_float_is_refused_naming_its_key(override):
    key, value = override.split("=")
    shown = repr(float(value))  # 1e400 is read as inf, and named so
    with pytest.raises(ConfigError, match="^" + re.escape(f"{key}={shown} must be a finite number")):
        compose_config(override)


def float_keys(config: Any, prefix: str = "") -> Iterator[str]:
    for spec in dataclasses.fields(config):
        value = getattr(config, spec.name)
        if dataclasses.is_dataclass(value):
            yield from float_keys(value, f"{prefix}{spec.name}.")
        elif spec.type in (float, Optional[float]):
            yield f"{prefix}{spec.name}"


def with_value(config: Any, key: str, value: float) -> Any:
    *path, name = key.split(".")
    node = config
    for part in path:
        node = getattr(node, part)
    setattr(node, name, value)
    return config


@pytest.mark.parametrize(
    "schema, nested",
    [(TrainConfig, "optim.lr_d"), (lambda: EvaluateConfig(checkpoint="x"), "metrics.classifier.lr")],
    ids=["train", "evaluate"],
)
def test_every_float_field_of_every_schema_is_checked_for_nan_and_inf(schema, nested):
    keys = list(float_keys(schema()))
    assert nested in keys  # the walk reached the nested groups
    for key in keys:
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(ConfigError, match="^" + re.escape(f"{key}={bad!r} must be a finite number")):
                with_value(schema(), key, bad).check()


def test_train_cli_refuses_an_infinite_lr_d_before_training(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("optim.lr_d=inf", f"hydra.run.dir={run_dir}")
    output = assert_refused(result, "optim.lr_d=inf must be a finite number", run_dir=run_dir)
    assert "Non-finite loss" not in output  # no longer blamed on optim.lr after a step


@pytest.mark.parametrize(
    "override, key",
    [
        ("metrics.classifier.lr=nan", "metrics.classifier.lr=nan"),
        ("metrics.class_threshold=inf", "metrics.class_threshold=inf"),
    ],
)
def test_evaluate_cli_refuses_a_non_finite_float_naming_its_key(tmp_path, override, key):
    result = run_evaluate("checkpoint=nowhere.pt", "threads=1", override, cwd=tmp_path)
    assert_refused(result, f"{key} must be a finite number")


# 3. the stop on a non-finite loss says what exists --------------------------------------------------


def nan_from_the_start(monkeypatch) -> None:
    """The bce G loss is NaN from its first call: step 1 is the first non-finite one."""
    real = LOSSES["bce"]
    monkeypatch.setitem(
        gan.core.losses.LOSSES, "bce", AdversarialLoss(real.d, lambda logits: real.g(logits) * math.nan)
    )


def test_a_nan_at_step_one_claims_no_checkpoint_that_does_not_exist(tmp_path, monkeypatch):
    nan_from_the_start(monkeypatch)
    with pytest.raises(NonFiniteLossError) as caught:
        train(compose_config("trainer.max_steps=4"), tmp_path)
    message = str(caught.value)
    assert message.startswith("Non-finite loss at step 1: ")
    assert "still holds" not in message  # the old claim: there was no checkpoint to hold anything
    assert not (tmp_path / "checkpoints" / "last.pt").exists()
    assert "optim.lr" in message and "trainer.on_nan=skip" in message


def watched_nan(step: int, checkpoint: Path, cfg: TrainConfig) -> str:
    watch = NonFiniteWatch(CPU, checkpoint, cfg)
    watch.update(step, torch.tensor(0.7), torch.tensor(math.nan))
    with pytest.raises(NonFiniteLossError) as caught:
        watch.check()
    return str(caught.value)


def test_the_non_finite_loss_message_says_there_is_no_checkpoint_yet_and_names_optim_lr(tmp_path):
    last = tmp_path / "checkpoints" / "last.pt"
    message = watched_nan(1, last, compose_config())
    assert message.startswith("Non-finite loss at step 1: loss/d=0.699999988079071, loss/g=nan.")
    assert f"this run had written none yet ({last} does not exist)" in message
    assert "Lower optim.lr (set to 0.001: the step size of G and D), try loss=hinge" in message
    assert "optim.lr_d" not in message  # not set in this run


def test_the_non_finite_loss_message_names_the_checkpoint_step_and_both_rates(tmp_path):
    cfg = compose_config("trainer.max_steps=2", "optim.lr_d=0.0004", "loss=hinge")
    train(cfg, tmp_path)  # a real run writes checkpoints/last.pt at step 2
    last = tmp_path / "checkpoints" / "last.pt"
    message = watched_nan(3, last, cfg)
    assert f"{last} keeps step 2, the last good one." in message
    assert "Lower optim.lr (set to 0.001: G's step size) or optim.lr_d (set to 0.0004: D's)" in message
    assert "loss=hinge" not in message  # this run already uses it


# 4. a minibatch-stddev group must divide the batch D sees ---------------------------------------


def test_a_minibatch_std_group_that_does_not_divide_the_batch_is_refused_naming_both_keys(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("model.minibatch_std=5", "data.batch_size=16", f"hydra.run.dir={run_dir}")
    assert_refused(
        result,
        "model.minibatch_std=5 must divide the 16 samples D judges at once (data.batch_size=16)",
        "groups of 1 sample, a constant channel",
        "such as 4",
        run_dir=run_dir,
    )


def test_the_minibatch_std_group_is_checked_against_each_pack():
    with pytest.raises(ConfigError, match=r"the 8 samples D judges at once \(data\.batch_size=16 / model\.pack=2\)"):
        compose_config("model.minibatch_std=6", "model.pack=2", "data.batch_size=16")
    assert compose_config("model.minibatch_std=4", "data.batch_size=16").model.minibatch_std == 4
    assert compose_config("model.minibatch_std=8", "model.pack=2", "data.batch_size=16").model.pack == 2


# 5. data.limit beyond the dataset -----------------------------------------------------------------


def test_a_limit_above_the_training_split_is_refused_naming_its_size(tmp_path):
    write_mnist(tmp_path, train=40)
    with pytest.raises(
        ConfigError, match=r"data\.limit=41 is more than the 40 images in the training split of data=mnist"
    ):
        load_dataset(cfg_for("mnist", tmp_path, limit=41, batch_size=32))
    assert len(load_dataset(cfg_for("mnist", tmp_path, limit=40, batch_size=32)).labels) == 40


def test_train_cli_refuses_a_limit_above_the_generated_set(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("data.limit=300", f"hydra.run.dir={run_dir}")  # debug=tiny renders 256 digits
    output = assert_refused(
        result, "data.limit=300 is more than the 256 images in the training split of data=digits", run_dir=run_dir
    )
    assert "data.num_samples" in output


# 6. a file where a folder belongs -------------------------------------------------------------------


def test_a_folder_root_that_is_a_file_is_called_a_file(tmp_path):
    image = tmp_path / "one.png"
    write_image(image, (20, 20))
    run_dir = tmp_path / "run"
    result = run_train("data=folder", f"data.root={image}", f"hydra.run.dir={run_dir}")
    output = assert_refused(result, f"data.root='{image}' is a file", "not a folder")
    assert "does not exist" not in output
    assert not (run_dir / "checkpoints").exists()


def test_a_celeba_folder_that_is_a_file_is_called_a_file(tmp_path):
    (tmp_path / "celeba").write_bytes(b"not a folder")
    with pytest.raises(DataError, match=r"celeba \(absolute path .*\) is a file, not a folder") as caught:
        load_dataset(cfg_for("celeba", tmp_path, channels=3))
    assert "does not exist" not in str(caught.value)


# 7. damaged held-out (test) files at train time ------------------------------------------------------


def damaged_mnist(root: Path, damage: str) -> Path:
    """MNIST IDX files (40 training, 8 test images) whose test labels file is damaged; returns it."""
    write_mnist(root, train=40, test=8)
    labels = root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    if damage == "truncated":  # the header still counts 8 labels; the file holds 6
        labels.write_bytes(labels.read_bytes()[:-2])
    else:  # labels 5..12: three of them are no digit
        write_idx(labels, np.arange(8) + 5)
    return labels


DAMAGE = {"truncated": "is truncated", "out of range": "outside the 10 classes 0-9"}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_test_labels_are_refused_naming_the_file(tmp_path, damage):
    labels = damaged_mnist(tmp_path, damage)
    with pytest.raises(DataError) as caught:
        load_dataset(cfg_for("mnist", tmp_path), train=False)
    assert str(labels) in str(caught.value) and DAMAGE[damage] in str(caught.value)
    assert len(load_dataset(cfg_for("mnist", tmp_path)).labels) == 40  # the training split is whole


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_training_warns_about_damaged_test_labels_naming_the_file(tmp_path, damage):
    labels = damaged_mnist(tmp_path / "data", damage)
    run_dir = tmp_path / "run"
    result = run_train("data=mnist", f"data.root={tmp_path / 'data'}", f"hydra.run.dir={run_dir}")
    output = output_of(result)
    assert result.returncode == 0, output[-3000:]  # the held-out split is a diagnostic here
    warnings = [line for line in output.splitlines() if "[WARNING]" in line and "held-out split" in line]
    assert len(warnings) == 1, output[-3000:]
    assert str(labels) in warnings[0] and DAMAGE[damage] in warnings[0] and "evaluate.py" in warnings[0]


# trainer.final_eval_samples measures the trained generator on the held-out split; trainer.eval_every
# trains the metrics classifier, which is tested on it: either stops before training on damaged labels
REFUSED_LABELS = [
    ("truncated", ["trainer.final_eval_samples=20"],
     ["{labels} is truncated", "trainer.final_eval_samples=20 measures the trained generator"]),
    ("out of range", ["trainer.eval_every=2", "trainer.eval_samples=10", "trainer.overfit_every=0"],
     ["labels file {labels} holds values from 5 to 12"]),
]  # fmt: skip


@pytest.mark.parametrize("damage, measuring, expected", REFUSED_LABELS, ids=["final_eval", "eval_every"])
def test_a_run_that_measures_on_the_held_out_split_stops_on_damaged_test_labels(tmp_path, damage, measuring, expected):
    labels = damaged_mnist(tmp_path / "data", damage)
    run_dir = tmp_path / "run"
    result = run_train("data=mnist", f"data.root={tmp_path / 'data'}", *measuring, f"hydra.run.dir={run_dir}")
    assert_refused(result, *(text.format(labels=labels) for text in expected))
    assert not (run_dir / "checkpoints").exists()


def test_a_folder_too_small_for_a_held_out_split_is_only_noted(tmp_path, caplog):
    # not damage: the held-out split is simply empty, and the run goes on with an INFO line as before
    folder = tmp_path / "images"
    names = [f"{i:03d}.png" for i in range(60) if not is_held_out(Path(f"{i:03d}.png"))]
    for i, name in enumerate(names):
        write_image(folder / name, (16, 16), seed=i)
    cfg = compose_config("data=folder", f"data.root={folder}", "data.channels=3")
    with pytest.raises(EmptySplitError):
        load_dataset(cfg.data, train=False)
    with caplog.at_level(logging.INFO, logger="gan.training.overfit"):
        assert build_probe(cfg, load_dataset(cfg.data), CPU) is None
    assert [r.levelname for r in caplog.records if "held-out" in r.getMessage()] == ["INFO"]
