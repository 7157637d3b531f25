"""This process and its hardware: the device, threads and seeds, and the CPU allocator setting."""

import ctypes
import os
import random

import torch

from gan.errors import ConfigError


def setup_torch(device: str, threads: int, seed: int, key: str) -> torch.device:
    """threads=0 keeps torch's default; `key` names the setting in errors."""
    if threads:
        torch.set_num_threads(threads)
    seed_everything(seed)
    return resolve_device(device, key)


def available_cpus() -> int:
    """Its affinity mask where the OS has one, else every CPU."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def seed_everything(seed: int) -> None:
    """Not numpy's: this project draws nothing from it."""
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def resolve_device(name: str, key: str = "trainer.device") -> torch.device:
    if name == "auto":  # the first available; the checks below then pass
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"{key}={name!r} but this machine has no usable CUDA device "
                f"(torch.cuda.is_available() is False); use {key}=cpu or auto."
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{key}={name!r} but only {torch.cuda.device_count()} CUDA device(s) are visible.")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{key}={name!r} but MPS is not available here; use {key}=cpu or auto.")
    return device


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers from glibc's <malloc.h>


def retain_freed_memory(limit_bytes: int = 1 << 30) -> bool:
    """glibc keeps freed blocks for reuse instead of unmapping them, so large activations stop page-faulting
    every step (as a jemalloc preload would; docs/speed.md). Returns whether it took effect (glibc only)."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        _ = libc.gnu_get_libc_version  # only glibc has it; other C libraries' mallopt differs or is absent
    except (AttributeError, OSError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, limit_bytes)) and bool(mallopt(_M_TRIM_THRESHOLD, 2 * limit_bytes - 1))
