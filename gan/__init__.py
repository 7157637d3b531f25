"""dcgan-reference: a DCGAN trainer that reads as a worked example of PyTorch technique.

Data flows one way: train.py -> gan.config -> gan.data, gan.core -> gan.training; gan.core imports nothing else here.
"""

from contextlib import suppress
from importlib import import_module, metadata

API = ("train", "load_generator", "sample", "evaluate", "compose_config")  # gan/api.py, imported on first use

__version__ = "unknown"  # a clone used without `pip install`: its commit says what ran (gan.device)
with suppress(metadata.PackageNotFoundError):
    __version__ = metadata.version("dcgan-reference")


def __getattr__(name: str) -> object:
    if name in API:
        return getattr(import_module("gan.api"), name)
    raise AttributeError(f"module 'gan' has no attribute {name!r}")
