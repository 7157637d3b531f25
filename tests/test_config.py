"""Config tier: every group composes; bad overrides and out-of-range values fail with the key named."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, Iterator, Optional

import pytest
import torch
from conftest import CONFIG_DIR, compose_config, run_evaluate, run_train
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from gan.config import (
    BackwardMode,
    ConfigError,
    DatasetName,
    EvaluateConfig,
    LossName,
    TrainConfig,
)
from gan.data.sources import _OPENERS
from gan.device import available_cpus, resolve_device


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["data", "model", "loss", "optim", "trainer", "experiment", "debug"])
def test_every_option_of_every_group_composes(group):
    assert options(group), f"configs/{group}/ is empty"
    for option in options(group):
        assert isinstance(compose_config(f"{group}={option}"), TrainConfig)


def test_each_dataset_has_one_name_one_yaml_and_one_opener():
    names = {member.value for member in DatasetName}
    assert set(options("data")) == names
    assert set(_OPENERS) == set(DatasetName)
    for name in names:  # the file is the option of that name, not a copy of another
        assert OmegaConf.load(CONFIG_DIR / "data" / f"{name}.yaml").name == name


def test_group_files_state_only_what_differs_from_the_schema():
    """The dataclasses hold every default; a yaml that repeats one would be a second place to change it."""
    defaults = TrainConfig()
    for group in ("data", "model", "loss", "optim", "trainer"):
        schema = OmegaConf.structured(getattr(defaults, group))
        for option in options(group):
            stated = OmegaConf.load(CONFIG_DIR / group / f"{option}.yaml")
            repeated = [k for k, v in stated.items() if k != "name" and schema[k] == v]
            assert not repeated, f"configs/{group}/{option}.yaml repeats the schema's default of {repeated}"


def test_defaults_are_the_documented_contract_and_overrides_reach_the_typed_config():
    cfg = compose_config()
    assert cfg.data.name == "digits" and cfg.loss.name == LossName.bce
    assert cfg.loss.backward_mode == BackwardMode.summed
    assert cfg.trainer.device == "cpu"  # set by debug=tiny; the shipped default is auto:
    assert compose_config("trainer.device=auto").trainer.device == "auto"
    cfg = compose_config("loss=hinge", "optim.lr=1e-4", "trainer.seed=3")
    assert cfg.loss.name == LossName.hinge and cfg.optim.lr == 1e-4 and cfg.trainer.seed == 3


@pytest.mark.parametrize("recipe", ["fashion_mnist", "mnist", "stacked", "cifar10", "celeba"])
def test_dataset_recipes_keep_the_paper_settings_they_were_measured_with(recipe):
    """Every dataset recipe includes experiment=paper (widths 64, batch 128, Adam 2e-4), not the CPU defaults."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        paper = compose(config_name="train", overrides=["experiment=paper"])
        default = compose(config_name="train")
        cfg = compose(config_name="train", overrides=[f"experiment={recipe}"])
    assert (default.model.g_width, default.data.batch_size, default.optim.lr) == (32, 64, 1e-3)
    for key in ("model.g_width", "model.d_width", "data.batch_size", "optim.lr"):
        assert OmegaConf.select(cfg, key) == OmegaConf.select(paper, key) != OmegaConf.select(default, key)
    own = OmegaConf.load(CONFIG_DIR / "experiment" / f"{recipe}.yaml").trainer.max_steps
    assert cfg.trainer.max_steps == own != paper.trainer.max_steps


# The command line, as a user meets it: one paragraph naming the setting, exit 2 (bad input), no traceback, and no
# folder. Hydra's own refusals included (more: test_launch.py's REFUSED): Hydra alone would print several
# paragraphs and exit 1. {cpus}: the CPUs this process may use, read from the machine.
REFUSED = [  # program, its overrides (split at spaces) -> what the paragraph says (each of its |-separated parts)
    ("train", "optim.lr=[1,2]", "optim.lr"),  # a list for a number
    ("train", "optim.lr={a:1}", "optim.lr"),  # a dict for a number
    ("train", "trainer.max_steps=", "trainer.max_steps"),  # empty
    ("train", "data.name=nosuch", "nosuch"),  # unknown dataset: DatasetName refuses it
    ("train", "loss.name=foo", "foo"),  # unknown choice of an enum
    ("train", "max_steps", "'max_steps'"),  # no '=': Hydra's grammar
    ("train", "model.z_dim=\u00fc", "model.z_dim"),  # a character the grammar has no token for
    ("train", "+trainer.foo=1", "trainer.foo is not a setting"),  # kept by Hydra, then read by nothing
    ("train", "trainer.seed=99999999999999999999", "trainer.seed"),  # beyond torch's 64 bits (was a traceback)
    ("train", "trainer.resume=", "checkpoint path is empty (an unset shell variable?)"),  # would start a new run
    ("train", "data.root=", "data.root='' is empty"),  # would read the launch directory as the dataset
    ("train", "data.num_workers=100000", "data.num_workers"),  # a process each
    ("train", "data.image_size=24", "data.image_size"),  # out of range, refused before training
    ("train", "data.image_size=512", "data.image_size"),
    ("train", "data.batch_size=0", "data.batch_size"),
    ("train", "optim.lr=0", "optim.lr"),
    ("train", "trainer.device=gpu", "trainer.device"),
    ("train", "loss.feature_matching=-1", "loss.feature_matching"),
    ("train", "data.limit=-1", "data.limit"),
    ("train", "data.limit=16", "data.limit"),  # below debug=tiny's batch of 32: not one full batch
    ("train", "model.minibatch_std=64", "model.minibatch_std=64"),  # a group larger than debug=tiny's batch of 32
    ("train", "model.conditional=true model.pack=2", "model.pack"),
    ("train", "trainer.overfit_every=-1", "trainer.overfit_every"),
    ("train", "trainer.threads=1000000", "trainer.threads=1000000 is more than the {cpus} CPU(s) this process may"),
    ("train", "trainer.threads=1099511627776", "trainer.threads=1099511627776 is more than the {cpus} CPU(s)"),
    ("evaluate", "checkpoint=nowhere.pt threads=1000000", "threads=1000000 is more than the {cpus} CPU(s)"),
    ("evaluate", "checkpoint=x threads=1 num_samples=abc", "num_samples=abc|'abc'|Nothing was written"),  # Hydra's
    ("train", "optim.lr_d=inf", "optim.lr_d=inf must be a finite number"),  # was blamed on optim.lr after a step
    ("evaluate", "checkpoint=x threads=1 metrics.classifier.lr=nan", "metrics.classifier.lr=nan must be a finite"),
    ("evaluate", "checkpoint=x threads=1 metrics.class_threshold=inf", "metrics.class_threshold=inf must be a"),
    (
        "train",
        "model.minibatch_std=5 model.pack=2 data.batch_size=32",  # a minibatch-stddev group that does not divide a pack
        "model.minibatch_std=5 must divide the 16 samples D judges at once (data.batch_size=32 / model.pack=2)|"
        "groups of 1 sample, a constant channel|such as 4",
    ),
]


@pytest.mark.parametrize(("program", "overrides", "said"), REFUSED)
def test_a_setting_the_config_refuses_ends_the_command_naming_it(tmp_path, program, overrides, said):
    run, device = (run_train, []) if program == "train" else (run_evaluate, ["device=cpu"])
    result = run(*device, *overrides.split(), f"hydra.run.dir={tmp_path / 'run'}")
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output and "Non-finite loss" not in output, output[-3000:]
    for text in said.split("|"):
        assert text.format(cpus=available_cpus()) in output, output[-3000:]
    assert len(output.strip().splitlines()) == 1 and len(output.strip()) > 40  # one paragraph, on one line
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_a_sweep_with_one_value_hydra_refuses_is_refused_before_any_job_runs(tmp_path):
    result = run_train("-m", "optim.lr=1e-3,abc", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "optim.lr=abc" in output and "Nothing was written" in output
    assert not (tmp_path / "sweep").exists()


def test_an_empty_run_folder_is_refused_not_read_as_the_launch_directory(tmp_path):
    # hydra.run.dir=$RUN, unset; quoted here (the bare ones: test_launch.py's REFUSED)
    result = run_train("hydra.run.dir=''", cwd=tmp_path)
    assert result.returncode == 2 and "is empty (an unset shell variable?)" in result.stdout + result.stderr
    assert not any(tmp_path.iterdir())


def test_the_thread_limit_is_this_machines_cpu_count():
    cpus = available_cpus()  # whatever the machine: the boundary is read from it, not assumed
    assert compose_config(f"trainer.threads={cpus}").trainer.threads == cpus
    with pytest.raises(ConfigError, match=rf"trainer\.threads={cpus + 1} is more than the {cpus} CPU"):
        compose_config(f"trainer.threads={cpus + 1}")
    with pytest.raises(ConfigError, match=rf"^threads={cpus + 1} is more than"):
        EvaluateConfig(checkpoint="x", threads=cpus + 1).check()


def float_keys(config: Any, prefix: str = "") -> Iterator[str]:
    for spec in dataclasses.fields(config):
        value = getattr(config, spec.name)
        if dataclasses.is_dataclass(value):
            yield from float_keys(value, f"{prefix}{spec.name}.")
        elif spec.type in (float, Optional[float]):
            yield f"{prefix}{spec.name}"


def with_value(config: Any, key: str, value: float) -> Any:
    *path, name = key.split(".")
    setattr(functools.reduce(getattr, path, config), name, value)
    return config


@pytest.mark.parametrize(
    "schema, nested",
    [(TrainConfig, "optim.lr_d"), (lambda: EvaluateConfig(checkpoint="x"), "metrics.classifier.lr")],
    ids=["train", "evaluate"],
)
def test_every_float_field_of_every_schema_is_checked_for_nan_and_inf(schema, nested):
    keys = list(float_keys(schema()))
    assert nested in keys  # the walk reached the nested groups
    with pytest.raises(ConfigError, match=r"^loss\.r1=inf must be a finite number"):
        compose_config("loss.r1=1e400")  # Hydra reads 1e400 as a float: inf
    for key in keys:
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(ConfigError, match="^" + re.escape(f"{key}={bad!r} must be a finite number")):
                with_value(schema(), key, bad).check()


def test_wgan_gp_with_batchnorm_names_its_recipe():
    with pytest.raises(ConfigError, match=r"model\.d_batchnorm=True .*experiment=wgan_gp"):
        compose_config("loss=wgan_gp", "model.d_batchnorm=true")
    with pytest.raises(ConfigError, match=r"model\.d_batchnorm=True"):
        compose_config("loss.r1=1", "experiment=paper")  # DCGAN's D, with BatchNorm
    assert compose_config("loss=wgan_gp").loss.gradient_penalty == 10.0  # the default D has no BatchNorm
    cfg = compose_config("experiment=wgan_gp")
    assert cfg.loss.name == LossName.wgan_gp and cfg.loss.gradient_penalty == 10.0
    assert not cfg.model.d_batchnorm and (cfg.optim.beta1, cfg.optim.beta2) == (0.0, 0.9)
    assert not cfg.model.spectral_norm  # the paper's critic: the penalty alone bounds its gradient


def test_debug_tiny_writes_what_a_real_run_writes(tmp_path):
    result = run_train("debug=tiny", f"hydra.run.dir={tmp_path}", tiny=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "checkpoints" / "last.pt").is_file() and list((tmp_path / "samples").glob("*.png"))
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_debug_overfit_sees_one_batch_over_and_over():
    cfg = compose_config("debug=overfit")  # replaces the tests' debug=tiny
    assert cfg.data.limit == cfg.data.batch_size and cfg.trainer.max_steps >= 300


HYDRA_REFUSED = {  # override -> the key Hydra's error names, the value it quotes (evaluate.py's: REFUSED)
    "max_steps float": ("trainer.max_steps=1.5", "trainer.max_steps", "1.5"),
    "precision typo": ("trainer.precision=fp64", "trainer.precision", "fp64"),
    "diffaugment policy": ("model.diffaugment=[rotate]", "model.diffaugment", "rotate"),
}


@pytest.mark.parametrize(("override", "key", "value"), HYDRA_REFUSED.values(), ids=HYDRA_REFUSED)
def test_hydra_refuses_a_wrong_type_or_choice_naming_the_key_and_the_value(override, key, value):
    with pytest.raises(ConfigCompositionException) as caught:
        compose_config(override)
    cause = caught.value.__cause__  # OmegaConf's error, which Hydra prints under its own line
    assert override in str(caught.value) and f"'{value}'" in str(cause)
    assert re.fullmatch(rf"{re.escape(key)}(\[\d+\])?", str(getattr(cause, "full_key", ""))), cause


EDGES = {  # the refused override(s), an accepted neighbour, the key=value the message opens with
    "max_steps 0": (["trainer.max_steps=0"], ["trainer.max_steps=1"], "trainer.max_steps=0"),
    "beta1 1.0": (["optim.beta1=1.0"], ["optim.beta1=0.99"], "optim.beta1=1.0"),
    "ema_decay 1.0": (["model.ema_decay=1.0"], ["model.ema_decay=0.9999"], "model.ema_decay=1.0"),
    "real_label 0.3": (["loss.real_label=0.3"], ["loss.real_label=0.9"], "loss.real_label=0.3"),
    "real_label 0.5": (["loss.real_label=0.5"], ["loss.real_label=0.51"], "loss.real_label=0.5"),
    "minibatch_std 6 of a pack of 8": (
        ["model.pack=2", "data.batch_size=16", "model.minibatch_std=6"],
        ["model.pack=2", "data.batch_size=16", "model.minibatch_std=8"],
        "model.minibatch_std=6",
    ),
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
