"""Shared fixtures: the real configs composed with Hydra's compose API, shrunk to test size."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from gan.config import TrainConfig, register_configs, validate
from gan.core.models import Discriminator, Generator

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"

# Every test starts from configs/debug/tiny.yaml: a few seconds per run on 2 cores, big enough to
# exercise every block type. A caller's own debug=... comes later and replaces it (Hydra applies
# overrides in order). tiny trains on the CPU on every machine; GAN_TEST_DEVICE=cuda moves every
# training run of the suite to the GPU (tests that call for a device of their own still get it).
DEVICE = os.environ.get("GAN_TEST_DEVICE")
TINY = ["debug=tiny", *([f"trainer.device={DEVICE}"] if DEVICE else [])]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `cuda` run where a CUDA device is, and are skipped (with the reason) elsewhere."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


register_configs()


def compose_config(*overrides: str) -> TrainConfig:
    """The real configs/train.yaml with TINY (debug=tiny), then `overrides`, applied and validated."""
    GlobalHydra.instance().clear()  # nested initialize() raises; start clean every time
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*TINY, *overrides])
    return validate(cfg)


def run_train(
    *overrides: str, cwd: Path | None = None, timeout: float = 240, tiny: bool = True
) -> subprocess.CompletedProcess:
    """The real `python train.py` in a subprocess; returns the completed process (text output)."""
    flags = [o for o in overrides if o.startswith("-")]  # argparse wants -m before the overrides
    rest = [o for o in overrides if not o.startswith("-")]
    args = [sys.executable, str(ROOT / "train.py"), *flags, *(TINY if tiny else []), *rest]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(args, cwd=cwd or ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(autouse=True)
def _seed_and_clean_hydra():
    torch.manual_seed(0)
    yield
    GlobalHydra.instance().clear()


@pytest.fixture
def tiny_gan() -> tuple[Generator, Discriminator]:
    torch.manual_seed(0)
    return Generator(z_dim=16, width=8, channels=1, image_size=16), Discriminator(width=8, channels=1, image_size=16)
