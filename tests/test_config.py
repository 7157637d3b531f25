"""Config tier: every group composes; bad overrides and out-of-range values fail with the key named."""

from __future__ import annotations

import pytest
from conftest import CONFIG_DIR, compose_config, run_train

from gan.config import BackwardMode, ConfigError, LossName, TrainConfig


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["data", "model", "loss", "optim", "trainer", "experiment"])
def test_every_option_of_every_group_composes(group):
    assert options(group), f"configs/{group}/ is empty"
    for option in options(group):
        assert isinstance(compose_config(f"{group}={option}"), TrainConfig)


def test_defaults_are_the_documented_contract():
    cfg = compose_config()
    assert cfg.data.name == "digits" and cfg.loss.name == LossName.bce
    assert cfg.loss.backward_mode == BackwardMode.summed
    assert cfg.trainer.device == "cpu"  # set by TINY; the shipped default is auto:
    assert compose_config("trainer.device=auto").trainer.device == "auto"


def test_overrides_reach_the_typed_config():
    cfg = compose_config("loss=hinge", "optim.lr=1e-4", "trainer.seed=3")
    assert cfg.loss.name == LossName.hinge and cfg.optim.lr == 1e-4 and cfg.trainer.seed == 3


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.max_steps=-1", "trainer.max_steps"),
        ("data.batch_size=0", "data.batch_size"),
        ("data.image_size=48", "data.image_size"),
        ("data.image_size=512", "data.image_size"),
        ("optim.lr=0", "optim.lr"),
        ("optim.beta1=1.5", "optim.beta1"),
        ("trainer.device=gpu", "trainer.device"),
        ("loss.feature_matching=-1", "loss.feature_matching"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose_config(override)


# The command line, as a user meets it: Hydra's message, a non-zero exit, no Python traceback.
@pytest.mark.parametrize(
    "override, expected",
    [
        ("optim.lr=abc", "optim.lr"),  # wrong type
        ("optim.lrr=1", "lrr"),  # unknown key
        ("data=nosuch", "nosuch"),  # unknown option of a group
        ("loss.name=foo", "foo"),  # unknown choice of an enum
        ("trainer.max_steps=-1", "trainer.max_steps"),  # out of range, refused before training
        ("data.image_size=24", "data.image_size"),  # a size the model cannot build
    ],
)
def test_bad_command_line_fails_cleanly(tmp_path, override, expected):
    result = run_train(override, f"hydra.run.dir={tmp_path / 'run'}")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert expected in output
    assert "Traceback" not in output
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before any training
