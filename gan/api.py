"""Train, load, sample and measure in a notebook, with the command line's configs and checks (a refusal is a
gan.errors.ConfigError with train.py's message):

    import gan
    result = gan.train("outputs/notebook", "debug=tiny", "loss=hinge")  # train.py's overrides
    G = gan.load_generator(result.checkpoint)                           # or the run folder
    images = gan.sample(G, 64)                                          # (64, C, H, W) in [-1, 1]
    numbers = gan.evaluate(result.checkpoint, "num_samples=2000")       # evaluate.py's metrics.json"""

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gan.checkpoint import load_checkpoint
from gan.config import EvaluateConfig, TrainConfig, _require, check_device_name, validate, validate_and_check
from gan.core.models import Generator
from gan.core.sampling import sample as sample_from
from gan.device import resolve_device
from gan.errors import ConfigError, environment_error
from gan.evaluation.pipeline import build_generator, recompute_batchnorm_stats
from gan.evaluation.pipeline import evaluate as measure
from gan.launch import CONFIG_DIR, SCHEMAS, data_overrides, hydra_quote, hydra_refusal
from gan.training import TrainResult
from gan.training import train as train_run


def compose_config(*overrides: str) -> TrainConfig:
    """configs/train.yaml with train.py's overrides ("loss=hinge", "optim.lr=1e-4"), typed and checked."""
    return _composed(overrides)


def _composed(overrides: tuple[str, ...], program: str = "train") -> Any:  # typed and checked (train's: no checkpoint)
    _require(all(isinstance(o, str) for o in overrides), "overrides", overrides, "must be strings, one per setting")
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return validate_and_check(compose(config_name=program, overrides=list(overrides)), SCHEMAS[program])
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(hydra_refusal(err, program)) from err


def train(run_dir: str | Path, *overrides: str, config: TrainConfig | None = None) -> TrainResult:
    """A run in run_dir from train.py's overrides, or from a TrainConfig built in code, checked as train.py's."""
    _require(isinstance(run_dir, (str, Path)), "run_dir", run_dir, "must be a folder's path (str or Path)")
    _require(not Path(run_dir).expanduser().is_file(), "run_dir", str(run_dir), "is a file: name a folder for the run")
    why = "must be a TrainConfig (gan.compose_config gives one), or None with train.py's overrides"
    _require(config is None or isinstance(config, TrainConfig), "config", type(config).__name__, why)
    _require(config is None or not overrides, "overrides", " ".join(overrides), "and config= were both given: pass one")
    try:  # a config built in code: OmegaConf checks its types, as Hydra checks the command line's
        typed = _composed(overrides) if config is None else validate(OmegaConf.structured(config))
    except OmegaConfBaseException as err:
        raise ConfigError(str(err)) from err
    try:
        return train_run(typed, Path(run_dir))
    except OSError as err:  # a full disk, a read-only folder: as train.py says it
        raise environment_error(err, then="call gan.train again.") from err


def load_generator(path: str | Path, ema: bool = True, device: str = "cpu") -> Generator:
    """A checkpoint's generator in eval mode, checked and its BatchNorm statistics re-estimated as evaluate.py does."""
    _require(isinstance(path, (str, Path)), "path", path, "must be a checkpoint file or run folder (str or Path)")
    _require(isinstance(ema, bool), "ema", ema, "must be True or False")
    check_device_name(device, "device")
    settings, where = EvaluateConfig(), resolve_device(device, "device")
    G, _ = build_generator(load_checkpoint(path), ema, where, source=str(path))
    recompute_batchnorm_stats(G, settings.bn_batches, settings.batch_size, settings.seed, where)
    return G


def sample(G: Generator, n: int, seed: int = 0, classes: torch.Tensor | None = None) -> torch.Tensor:
    """n images in [-1, 1] from latents drawn with `seed`; a conditional G draws `classes` (default 0, 1, 2, ...)."""
    _require(isinstance(G, Generator), "type(G)", type(G).__name__, "is not Generator: gan.load_generator gives one")
    _require(isinstance(n, int) and not isinstance(n, bool) and n >= 1, "n", n, "must be a whole number >= 1")
    _require(isinstance(seed, int) and -(2**63) <= seed < 2**63, "seed", seed, "must be an int of 64 bits")
    if classes is not None:
        why = f"must be a tensor of {n} class numbers from 0 to {G.num_classes - 1}"
        ok = G.num_classes and isinstance(classes, torch.Tensor) and not classes.is_floating_point()
        ok = ok and classes.shape == (n,) and 0 <= int(classes.min()) and int(classes.max()) < G.num_classes
        _require(ok, "classes", classes, why if G.num_classes else "must be None: this G is unconditional")
    device = next(G.parameters()).device
    z = torch.randn(n, G.z_dim, generator=torch.Generator().manual_seed(seed)).to(device)
    if G.num_classes and classes is None:
        classes = torch.arange(n) % G.num_classes
    return sample_from(G, z, None if classes is None else classes.to(device))


def evaluate(checkpoint: str | Path, *overrides: str, run_dir: str | Path | None = None) -> dict[str, Any]:
    """evaluate.py's metrics.json for a checkpoint, from its overrides; its other outputs go into run_dir (or none)."""
    _require(isinstance(checkpoint, (str, Path)), "checkpoint", checkpoint, "must be a checkpoint file or run folder")
    _require(run_dir is None or isinstance(run_dir, (str, Path)), "run_dir", run_dir, "must be a folder's path")
    given = (f"checkpoint={hydra_quote(checkpoint)}", *overrides)
    settings = _composed(given, "evaluate")
    with tempfile.TemporaryDirectory() if run_dir is None else contextlib.nullcontext(run_dir) as folder:
        return measure(settings, Path(folder), data_overrides(OmegaConf.structured(settings), given))
