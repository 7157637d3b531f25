"""This process and its hardware: the device, threads and seeds, and the CPU allocator setting."""

import contextlib
import ctypes
import functools
import os
import platform
import random
import subprocess
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
import torchvision

import gan
from gan.errors import ConfigError


def setup_torch(device: str, threads: int, seed: int, key: str) -> torch.device:  # `key` names device in errors
    if threads:  # 0: torch's default
        torch.set_num_threads(threads)
    random.seed(seed)  # not numpy's: this project draws nothing from it
    torch.manual_seed(seed)  # also seeds every CUDA device
    return resolve_device(device, key)


def available_cpus() -> int:  # the affinity mask where the OS has one (not macOS, Windows)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def environment(device: torch.device) -> dict[str, Any]:
    """What a result depends on besides its config; checkpoints, the Text tab and metrics.json record it."""
    cuda, root, git = device.type == "cuda", Path(__file__).resolve().parents[1], {}
    if (root / ".git").exists():  # a clone (tracked files only); not a wheel in site-packages, which a venv may hold
        run = functools.partial(subprocess.run, cwd=root, capture_output=True, text=True, timeout=10, check=True)
        with contextlib.suppress(OSError, subprocess.SubprocessError):  # no git, or not a repository after all
            commit = run(["git", "rev-parse", "HEAD"]).stdout.strip()
            dirty = bool(run(["git", "status", "--porcelain", "--untracked-files=no"]).stdout.strip())
            git = {"git_commit": commit, "git_dirty": dirty}
    return {
        "package": gan.__version__,  # dcgan-reference's own: a wheel records no commit
        "python": platform.python_version(),
        "torch": str(torch.__version__),  # a TorchVersion, which neither YAML nor weights_only loading reads
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,  # the CUDA torch was built with (None: a CPU build)
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": torch.cuda.get_device_name(device) if cuda else f"{device.type} ({cpu_model()})",
        "device_count": torch.cuda.device_count() if cuda else available_cpus(),  # GPUs visible, or CPUs usable
        "platform": platform.platform(),
        **git,
    }


def cpu_model() -> str:  # Linux's /proc/cpuinfo names the model (platform.processor() says x86_64 there)
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []  # not Linux
    names = [line for line in lines if line.startswith("model name")]
    return names[0].split(":", 1)[1].strip() if names else platform.processor() or platform.machine()


def environment_changes(recorded: Optional[Mapping[str, Any]], current: Mapping[str, Any]) -> list[str]:
    """'torch: 2.5.1 -> 2.6.0' for each recorded entry that differs now."""
    recorded = recorded if isinstance(recorded, Mapping) else {}
    return [f"{key}: {recorded[key]} -> {current.get(key)}" for key in recorded if recorded[key] != current.get(key)]


def resolve_device(name: str, key: str = "trainer.device") -> torch.device:
    if name == "auto":  # the first available; the checks below then pass
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and (device.index or 0) >= (count := torch.cuda.device_count()):  # 0 without CUDA
        raise ConfigError(f"{key}={name!r} but only {count} CUDA device(s) are visible; use {key}=cpu or auto.")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{key}={name!r} but MPS is not available here; use {key}=cpu or auto.")
    return device


def retain_freed_memory(limit_bytes: int = 1 << 30) -> bool:
    """glibc keeps freed blocks mapped: no page faults each step (as jemalloc would; docs/speed.md); True if it took."""
    trim_threshold, mmap_threshold = -1, -3  # mallopt parameter numbers from glibc's <malloc.h>
    try:  # only glibc has gnu_get_libc_version; other C libraries' mallopt differs or is absent
        libc = ctypes.CDLL(None)
        mallopt, _ = libc.mallopt, libc.gnu_get_libc_version
    except (AttributeError, OSError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(mmap_threshold, limit_bytes)) and bool(mallopt(trim_threshold, 2 * limit_bytes - 1))
