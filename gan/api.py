"""Train, load and sample in a notebook, with the command line's configs and checks:

    import gan
    result = gan.train("outputs/notebook", "debug=tiny", "loss=hinge")  # train.py's overrides
    G = gan.load_generator(result.checkpoint)                           # or the run folder
    images = gan.sample(G, 64)                                          # (64, C, H, W) in [-1, 1]

A bad override or value is refused with the message train.py prints (gan.errors.ConfigError)."""

from pathlib import Path
from typing import Optional, Union

import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import Tensor

from gan.checkpoint import load_checkpoint
from gan.config import EvaluateConfig, TrainConfig, register_configs, validate
from gan.core.models import Generator
from gan.core.sampling import sample as sample_from
from gan.errors import ConfigError
from gan.evaluation.pipeline import build_generator, recompute_batchnorm_stats
from gan.runs import CONFIG_DIR
from gan.training import TrainResult
from gan.training import train as train_run


def compose_config(*overrides: str) -> TrainConfig:
    """configs/train.yaml with train.py's overrides ("loss=hinge", "optim.lr=1e-4"), typed and checked."""
    config = _composed(overrides)
    config.check()
    return config


def _composed(overrides: tuple[str, ...]) -> TrainConfig:
    """compose_config's config before its range checks (gan.training.train runs them)."""
    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return validate(compose(config_name="train", overrides=list(overrides)))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"{' '.join(overrides)}: {err}") from err


def train(run_dir: Union[str, Path], *overrides: str, config: Optional[TrainConfig] = None) -> TrainResult:
    """A run in run_dir from train.py's overrides, or from a TrainConfig built in code, checked as the
    command line's are: its types by OmegaConf, its ranges by gan/config.py (in gan.training.train)."""
    if config is None:
        return train_run(_composed(overrides), Path(run_dir))
    if overrides:
        raise ConfigError(f"Pass overrides ({' '.join(overrides)}) or config=, not both.")
    try:
        typed = validate(OmegaConf.structured(config))
    except OmegaConfBaseException as err:
        raise ConfigError(str(err)) from err
    return train_run(typed, Path(run_dir))


def load_generator(path: Union[str, Path], ema: bool = True, device: str = "cpu") -> Generator:
    """The generator of a checkpoint file or run folder, checked as evaluate.py checks it, in eval mode;
    an EMA generator's BatchNorm statistics are re-estimated as evaluate.py does (bn_batches)."""
    settings = EvaluateConfig()
    G, _ = build_generator(load_checkpoint(path), ema, torch.device(device), source=str(path))
    recompute_batchnorm_stats(G, settings.bn_batches, settings.batch_size, settings.seed, torch.device(device))
    return G


def sample(G: Generator, n: int, seed: int = 0, classes: Optional[Tensor] = None) -> Tensor:
    """n images in [-1, 1] from latents drawn with `seed`; a conditional G draws `classes` (default:
    0, 1, 2, ... in turn)."""
    device = next(G.parameters()).device
    z = torch.randn(n, G.z_dim, generator=torch.Generator().manual_seed(seed)).to(device)
    if G.num_classes and classes is None:
        classes = torch.arange(n) % G.num_classes
    return sample_from(G, z, None if classes is None else classes.to(device))
