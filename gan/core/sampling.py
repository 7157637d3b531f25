"""Sampling from G without disturbing training: eval mode, no autograd, previous mode restored. pytorch/examples
samples in train mode, so each snapshot also moves BatchNorm's running statistics (examples#804, #807)."""

import contextlib
import math
from typing import Iterator, Optional

import torch
from torch import Tensor, nn
from torchvision.utils import make_grid


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """module.eval() inside the block, then back to the mode it had (train or eval)."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


def sample(G: nn.Module, z: Tensor, y: Optional[Tensor] = None) -> Tensor:
    """G(z) in [-1, 1] with G in eval mode and autograd off; G(z, y) for a conditional G and classes y.
    eval(): BatchNorm normalises with its running statistics and leaves them unchanged.
    no_grad(): no graph is recorded, so nothing is kept for a backward that will never come.
    Neither implies the other. The EMA generator's running statistics are averages that do not match
    its averaged weights; evaluate.py recomputes them (gan/evaluation/pipeline.py:recompute_batchnorm_stats)."""
    with eval_mode(G), torch.no_grad():
        return G(z) if y is None else G(z, y)


def class_rows(z: Tensor, num_classes: int, max_rows: int = 16) -> tuple[Tensor, Tensor]:
    """Latents and classes for a conditional G's grid: one row per class (at most max_rows, evenly
    spread), each the first ceil(sqrt(len(z))) latents, so a column holds one z across the classes."""
    columns = math.ceil(math.sqrt(z.size(0)))
    classes = torch.linspace(0, num_classes - 1, min(num_classes, max_rows), device=z.device).round().long()
    return z[:columns].repeat(len(classes), 1), classes.repeat_interleave(columns)


def image_grid(images: Tensor, nrow: Optional[int] = None) -> Tensor:
    """A batch in [-1, 1] -> one float (C, H, W) grid in [0, 1] on the CPU, to log or save; `nrow`
    images a row (default: a square-ish grid)."""
    images = images.detach().float().cpu()  # .float(): bf16 has no numpy or PNG form
    nrow = nrow or math.ceil(math.sqrt(images.size(0)))
    return make_grid(images, nrow=nrow, padding=2, normalize=True, value_range=(-1, 1))
