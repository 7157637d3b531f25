"""Typed configuration: one dataclass per `configs/` group, registered with Hydra's ConfigStore.

Owns the schema (names, types, defaults and the reason for each default) and the range checks that
Hydra cannot express. It does not compose configs (Hydra does, from `configs/`) and it does not
build objects from them (`gan.training` does, with explicit constructors).

Because the primary config `configs/train.yaml` starts from the `train_schema` node below, a wrong
type (`optim.lr=abc`), an unknown key (`optim.lrr=1`) or an unknown choice (`loss.name=foo`) fails
at the command line with Hydra's own message. Checks of range (`trainer.max_steps=-1`) live in
`check()` methods and run through `validate()` before anything is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value that has the right type but cannot be used; the message names the key."""


class LossName(str, Enum):
    bce = "bce"  # non-saturating GAN loss (Goodfellow et al. 2014, sec. 3)
    hinge = "hinge"  # hinge loss (Lim & Ye 2017; Miyato et al. 2018)


class BackwardMode(str, Enum):
    summed = "summed"  # one backward() of the summed G objective
    separate = "separate"  # one backward() per term, retain_graph=True on all but the last


class OnNonFinite(str, Enum):
    stop = "stop"  # stop with an error naming the step; the last checkpoint stays the last good one
    skip = "skip"  # drop that step's update and go on (costs one host sync per step)


class Precision(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"  # torch.autocast with bfloat16: no loss scaling needed (same exponent range as fp32)


@dataclass
class DataConfig:
    name: str = "digits"  # dataset; `digits` is built in and needs no download
    root: str = "data"  # where datasets live, relative to the launch directory
    image_size: int = 32  # side in pixels: a power of two, 16..256 (G doubles it per block from 4x4)
    channels: int = 1  # 1 grayscale, 3 RGB
    batch_size: int = 128  # images per process and step; DCGAN paper: 128
    num_workers: int = 0  # DataLoader worker processes; 0 = batches are indexed from memory on the device
    num_samples: int = 60000  # digits: size of the generated training set (MNIST-sized)
    seed: int = 0  # digits: generation seed, apart from trainer.seed so every run sees the same data

    def check(self) -> None:
        _require(self.image_size >= 16 and self.image_size <= 256 and _power_of_two(self.image_size),
                 "data.image_size", self.image_size,
                 "must be a power of two from 16 to 256: the generator starts at 4x4 and doubles the "
                 "side in each block")
        _require(self.channels in (1, 3), "data.channels", self.channels, "must be 1 or 3")
        _require(self.batch_size >= 1, "data.batch_size", self.batch_size, "must be at least 1")
        _require(self.num_workers >= 0, "data.num_workers", self.num_workers, "must be >= 0")
        _require(self.num_samples >= self.batch_size, "data.num_samples", self.num_samples,
                 f"must be at least data.batch_size ({self.batch_size}): an epoch needs one full batch")


@dataclass
class ModelConfig:
    z_dim: int = 100  # latent size, DCGAN paper
    g_width: int = 64  # G's channels at full resolution (ngf); doubled per block toward 4x4
    d_width: int = 64  # D's channels at full resolution (ndf); doubled per block toward 4x4
    ema_decay: float = 0.999  # EMA of G's weights for sampling (Karras et al. 2018); 0 = off. About a 700-step half-life

    def check(self) -> None:
        for key in ("z_dim", "g_width", "d_width"):
            value = getattr(self, key)
            _require(value >= 1, f"model.{key}", value, "must be at least 1")
        _require(0 <= self.ema_decay < 1, "model.ema_decay", self.ema_decay, "must be in [0, 1) (0 = no EMA)")


@dataclass
class LossConfig:
    name: LossName = LossName.bce  # adversarial loss: bce (non-saturating) or hinge
    feature_matching: float = 0.0  # weight of the feature-matching term (Salimans et al. 2016); 0 = off
    backward_mode: BackwardMode = BackwardMode.summed  # separate = log each G term's gradient norm

    def check(self) -> None:
        _require(self.feature_matching >= 0, "loss.feature_matching", self.feature_matching,
                 "must be >= 0 (it weights a squared distance)")


@dataclass
class OptimConfig:
    lr: float = 2e-4  # Adam step size for G and D, DCGAN paper
    beta1: float = 0.5  # DCGAN paper: the default 0.9 made training oscillate
    beta2: float = 0.999  # Adam default

    def check(self) -> None:
        _require(self.lr > 0, "optim.lr", self.lr, "must be > 0")
        for key in ("beta1", "beta2"):
            value = getattr(self, key)
            _require(0 <= value < 1, f"optim.{key}", value, "must be in [0, 1)")


@dataclass
class TrainerConfig:
    max_steps: int = 1500  # generator updates; 1500 x 128 images is about 3 epochs of digits
    device: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps
    seed: int = 0  # seeds weights, latents and shuffling
    resume: Optional[str] = None  # a checkpoint file or a run directory to continue from
    precision: Precision = Precision.fp32  # fp32 | bf16 autocast
    channels_last: bool = True  # NHWC memory format: faster convolutions on CPU (oneDNN) and tensor cores
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default (one per core)
    log_every: int = 50  # steps between scalar logs (the only host syncs of the loop)
    sample_every: int = 250  # steps between fixed-noise sample grids
    checkpoint_every: int = 500  # steps between writes of checkpoints/last.pt (and one at the end)
    keep_checkpoints: int = 0  # also keep the last K numbered checkpoints (step_000500.pt, ...); 0 = none
    on_nan: OnNonFinite = OnNonFinite.stop  # what a NaN/inf loss does: stop | skip
    deterministic: bool = False  # bit-reproducible kernels on GPU (slower); CPU runs are already exact
    num_fixed_samples: int = 64  # images in the fixed-noise grid (an 8 x 8 grid)
    progress: bool = True  # show a tqdm progress bar on the terminal

    def check(self) -> None:
        _require(self.max_steps >= 1, "trainer.max_steps", self.max_steps, "must be at least 1")
        _require(self.threads >= 0, "trainer.threads", self.threads, "must be >= 0 (0 = torch's default)")
        _require(self.keep_checkpoints >= 0, "trainer.keep_checkpoints", self.keep_checkpoints, "must be >= 0")
        for key in ("log_every", "sample_every", "checkpoint_every", "num_fixed_samples"):
            value = getattr(self, key)
            _require(value >= 1, f"trainer.{key}", value, "must be at least 1")
        device = self.device
        known = device in ("auto", "cpu", "cuda", "mps") or (
            device.startswith("cuda:") and device[5:].isdigit())
        _require(known, "trainer.device", device, "must be auto, cpu, cuda, cuda:N or mps")


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def check(self) -> None:
        for group in (self.data, self.model, self.loss, self.optim, self.trainer):
            group.check()


def _power_of_two(n: int) -> bool:
    return n > 0 and 2 ** int(math.log2(n)) == n


def _require(ok: bool, key: str, value: Any, why: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} {why}.")


def validate(cfg: DictConfig) -> TrainConfig:
    """DictConfig (from Hydra) -> checked TrainConfig; raises ConfigError naming the key."""
    typed = OmegaConf.to_object(cfg)
    assert isinstance(typed, TrainConfig), type(typed)
    typed.check()
    return typed


def to_plain(cfg: TrainConfig | DictConfig) -> dict:
    """The resolved config as plain dicts, lists and strings: what a checkpoint and TensorBoard hold."""
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)
    return OmegaConf.to_container(node, resolve=True, enum_to_str=True)


def register_configs() -> None:
    """Make `train_schema` available to `configs/train.yaml`'s defaults list."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
