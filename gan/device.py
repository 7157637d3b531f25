"""Device choice: turns `trainer.device` into a torch.device that exists on this machine."""

from __future__ import annotations

import torch

from gan.config import ConfigError


def resolve_device(name: str) -> torch.device:
    """auto -> cuda if available, then mps, then cpu; an explicit device must be available."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"trainer.device={name!r} but this machine has no usable CUDA device "
                              "(torch.cuda.is_available() is False); use trainer.device=cpu or auto.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"trainer.device={name!r} but only {torch.cuda.device_count()} CUDA "
                              "device(s) are visible.")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"trainer.device={name!r} but MPS is not available here; use cpu or auto.")
    return device
