"""G as a file that runs without this project's code: TorchScript, torch.export (control flow: docs/more.md)."""

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
    def __init__(self, G: nn.Module):
        super().__init__()
        self.G = copy.deepcopy(G).cpu().to(memory_format=torch.contiguous_format).eval()
        self.z_dim: int = G.z_dim

    def forward(self, z: Tensor) -> Tensor:
        if z.dim() == 1:  # control flow on the input's rank, which trace does not record
            return self.G(z.unsqueeze(0)).squeeze(0)
        return self.G(z)


def example_latents(z_dim: int, batch: int = 2) -> Tensor:
    # A batch of 2: torch.export specialises sizes 0 and 1, so 1 would pin the batch dimension.
    return torch.randn(batch, z_dim, generator=torch.Generator().manual_seed(0))


def trace(G: nn.Module, example: Tensor) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():  # torch 2.x deprecates TorchScript (FutureWarning); shown for contrast
        warnings.simplefilter("ignore", FutureWarning)
        return torch.jit.trace(SamplingGenerator(G), example)


def script(G: nn.Module) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.jit.script(SamplingGenerator(G))


def export(G: nn.Module, example: Tensor) -> ExportedProgram:
    """A dynamic batch dimension; the rank-1 branch is guarded out."""
    return torch.export.export(SamplingGenerator(G), (example,), dynamic_shapes={"z": {0: Dim("batch", min=1)}})


def save_generator(G: nn.Module, formats: ExportFormat, out_dir: Path) -> list[Path]:
    """Reload with `torch.jit.load(path)` or `torch.export.load(path).module()`; both need only torch."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if formats in (ExportFormat.torchscript, ExportFormat.both):
        script(G).save(str(out_dir / TORCHSCRIPT_FILE))
        written.append(out_dir / TORCHSCRIPT_FILE)
    if formats in (ExportFormat.export, ExportFormat.both):
        torch.export.save(export(G, example_latents(G.z_dim)), str(out_dir / EXPORT_FILE))
        written.append(out_dir / EXPORT_FILE)
    return written
