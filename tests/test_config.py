"""Config tier: every group composes; bad overrides and out-of-range values fail with the key named."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, Iterator, Optional

import pytest
import torch
from conftest import CONFIG_DIR, DEVICE, compose_config
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from gan.config import BackwardMode, ConfigError, DatasetName, EvaluateConfig, LossName, TrainConfig
from gan.data.sources import _OPENERS
from gan.device import available_cpus, resolve_device


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["data", "model", "loss", "optim", "trainer", "experiment", "debug"])
def test_every_option_of_every_group_composes_stating_only_what_differs_from_the_schema(group):
    # the dataclasses hold every default; a yaml that repeats one would be a second place to change it
    schema = OmegaConf.structured(getattr(TrainConfig(), group, {}))  # experiment, debug: recipes of other groups
    assert options(group), f"configs/{group}/ is empty"
    for option in options(group):
        assert isinstance(compose_config(f"{group}={option}"), TrainConfig)
        stated = OmegaConf.load(CONFIG_DIR / group / f"{option}.yaml")
        repeated = [k for k, v in stated.items() if k in schema and k != "name" and schema[k] == v]
        assert not repeated, f"configs/{group}/{option}.yaml repeats the schema's default of {repeated}"


def test_each_dataset_has_one_name_one_yaml_and_one_opener():
    names = {member.value for member in DatasetName}
    assert set(options("data")) == names
    assert set(_OPENERS) == set(DatasetName)
    for name in names:  # the file is the option of that name, not a copy of another
        assert OmegaConf.load(CONFIG_DIR / "data" / f"{name}.yaml").name == name


def test_defaults_are_the_documented_contract_and_overrides_reach_the_typed_config():
    cfg = compose_config()
    assert cfg.data.name == "digits" and cfg.loss.name == LossName.bce
    assert cfg.loss.backward_mode == BackwardMode.summed
    assert cfg.trainer.device == (DEVICE or "cpu")  # debug=tiny's (GAN_TEST_DEVICE's); the shipped default is auto:
    assert compose_config("trainer.device=auto").trainer.device == "auto"
    cfg = compose_config("loss=hinge", "optim.lr=1e-4", "trainer.seed=3")
    assert cfg.loss.name == LossName.hinge and cfg.optim.lr == 1e-4 and cfg.trainer.seed == 3
    cfg = compose_config("debug=overfit")  # replaces the tests' debug=tiny: one batch, over and over
    assert cfg.data.limit == cfg.data.batch_size and cfg.trainer.max_steps >= 300


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
        *path, name = key.split(".")
        for bad in (math.nan, math.inf, -math.inf):
            setattr(functools.reduce(getattr, path, config := schema()), name, bad)
            pytest.raises(ConfigError, config.check).match("^" + re.escape(f"{key}={bad!r} must be a finite number"))


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


EDGES = {  # the settings alongside, the refused value (the message opens with it), an accepted neighbour
    "max_steps 0": ("", "trainer.max_steps=0", "trainer.max_steps=1"),
    "beta1 1.0": ("", "optim.beta1=1.0", "optim.beta1=0.99"),
    "ema_decay 1.0": ("", "model.ema_decay=1.0", "model.ema_decay=0.9999"),
    "real_label 0.3": ("", "loss.real_label=0.3", "loss.real_label=0.9"),
    "real_label 0.5": ("", "loss.real_label=0.5", "loss.real_label=0.51"),
    "minibatch_std 6, pack 8": ("model.pack=2 data.batch_size=16", "model.minibatch_std=6", "model.minibatch_std=8"),
    "eval_samples 5": ("trainer.eval_every=3", "trainer.eval_samples=5", "trainer.eval_samples=10"),
}


@pytest.mark.parametrize(("also", "refused", "accepted"), EDGES.values(), ids=EDGES)
def test_a_value_just_outside_a_range_is_refused_naming_the_key_and_the_one_inside_is_kept(also, refused, accepted):
    with pytest.raises(ConfigError) as caught:
        compose_config(*also.split(), refused)
    assert str(caught.value).startswith(refused + " ")
    key, value = accepted.split("=")
    assert str(OmegaConf.select(OmegaConf.structured(compose_config(*also.split(), accepted)), key)) == value


@pytest.mark.parametrize("key", ["trainer.device", "device"])
def test_a_cuda_index_beyond_the_visible_devices_is_refused_naming_the_setting(monkeypatch, key):
    # spelled right (check_device_name lets cuda:N through): only the machine can say no
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=re.escape(f"{key}='cuda:99' but only 1 CUDA device(s) are visible")):
        resolve_device("cuda:99", key)
    assert resolve_device("cuda:0", key) == torch.device("cuda", 0)
