"""The generator as a file that runs without this project's code: TorchScript and torch.export.

Owns the packaging (`SamplingGenerator`), the three ways to capture it, and saving/reloading.
Three ways to turn a module into a graph, and what each does with Python control flow, shown on
SamplingGenerator.forward's `if z.dim() == 1` (one latent or a batch):
- torch.jit.trace runs forward once on an example and records the tensor ops that ran. The `if` is
  evaluated in Python during that run and leaves no trace: traced with a batch, the module has only
  the batch path, and a single latent fails (or, with other code, silently takes the wrong path).
- torch.jit.script compiles the Python source of forward into TorchScript, both branches included,
  so the scripted module handles a single latent and a batch alike. torch has deprecated it in favour
  of torch.export; it remains the format older C++ (libtorch) runtimes load.
- torch.export traces like jit.trace but symbolically and soundly: the branch is resolved for the
  example's rank, and a guard records that assumption, so a single latent is refused with an error
  instead of run down the wrong path. The batch dimension is declared dynamic (`Dim`), so any batch
  size works. The result is an ExportedProgram (`.pt2`), input to AOTInductor and ExecuTorch.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram

from gan.config import ExportFormat

TORCHSCRIPT_FILE = "generator.torchscript.pt"
EXPORT_FILE = "generator.pt2"


class SamplingGenerator(nn.Module):
    """G packaged for use elsewhere: latents (N, z_dim) -> images (N, C, H, W) in [-1, 1], or one
    latent (z_dim,) -> one image (C, H, W). Always in eval mode (BatchNorm's running statistics)."""

    def __init__(self, G: nn.Module):
        super().__init__()
        self.G = copy.deepcopy(G).cpu().to(memory_format=torch.contiguous_format).eval()
        self.z_dim: int = G.z_dim

    def forward(self, z: Tensor) -> Tensor:
        if z.dim() == 1:  # one latent: control flow on the input's rank (see the module docstring)
            return self.G(z.unsqueeze(0)).squeeze(0)
        return self.G(z)


def example_latents(z_dim: int, batch: int = 2) -> Tensor:
    # A batch of 2: torch.export specialises sizes 0 and 1, so 1 would pin the batch dimension.
    return torch.randn(batch, z_dim, generator=torch.Generator().manual_seed(0))


def trace(G: nn.Module, example: Tensor) -> torch.jit.ScriptModule:
    """torch.jit.trace: records the ops one example runs (the `if` is not recorded)."""
    with warnings.catch_warnings():  # torch 2.x deprecates TorchScript (FutureWarning); shown for contrast
        warnings.simplefilter("ignore", FutureWarning)
        return torch.jit.trace(SamplingGenerator(G), example)


def script(G: nn.Module) -> torch.jit.ScriptModule:
    """torch.jit.script: compiles forward's source, both branches of the `if` included."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.jit.script(SamplingGenerator(G))


def export(G: nn.Module, example: Tensor) -> ExportedProgram:
    """torch.export with a dynamic batch dimension; the rank-1 branch is guarded out."""
    batch = Dim("batch", min=1)
    return torch.export.export(SamplingGenerator(G), (example,), dynamic_shapes={"z": {0: batch}})


def save_generator(G: nn.Module, formats: ExportFormat, out_dir: Path) -> list[Path]:
    """Write G in the requested formats into out_dir; returns the files written.

    Reload with `torch.jit.load(path)` or `torch.export.load(path).module()`; both run on the CPU
    and need only torch.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if formats in (ExportFormat.torchscript, ExportFormat.both):
        path = out_dir / TORCHSCRIPT_FILE
        script(G).save(str(path))
        written.append(path)
    if formats in (ExportFormat.export, ExportFormat.both):
        path = out_dir / EXPORT_FILE
        torch.export.save(export(G, example_latents(G.z_dim)), str(path))
        written.append(path)
    return written
