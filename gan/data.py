"""Datasets and the batch stream that feeds the training loop.

Owns: the built-in `digits` dataset (rendered, never downloaded), scaling pixels to [-1, 1] to
match G's tanh, and an endless, resumable stream of shuffled batches. It leaves models and
training to others.

Small datasets are held in memory as one uint8 tensor on the training device and batched by
indexing: no DataLoader worker round-trip and no per-batch host-to-device copy.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor
from torch.utils.data import DataLoader, Sampler, TensorDataset

from gan.config import DataConfig

log = logging.getLogger(__name__)

NUM_DIGIT_CLASSES = 10
_STROKES = (1, 2, 3)  # extra stroke width in template pixels: thin, regular, bold


class DataError(RuntimeError):
    """A dataset that cannot be loaded; the message says where it looked and what it expected."""


@dataclass
class ImageSet:
    """Images as uint8 (N, C, H, W) with their integer class labels (N,)."""

    images: Tensor
    labels: Tensor
    num_classes: int


def load_dataset(cfg: DataConfig, train: bool = True) -> ImageSet:
    """The configured dataset's training split (train=True) or held-out split."""
    if cfg.name == "digits":
        if cfg.channels != 1:
            raise DataError(f"data=digits is grayscale: set data.channels=1 (got {cfg.channels}).")
        # The held-out split uses another seed, so no image of it is in the training set.
        seed = cfg.seed if train else cfg.seed + 1_000_003
        count = cfg.num_samples if train else max(cfg.num_samples // 6, 1)
        images, labels = render_digits(count, cfg.image_size, seed)
        return ImageSet(images, labels, NUM_DIGIT_CLASSES)
    raise DataError(f"data.name={cfg.name!r} is not a known dataset; the built-in one is 'digits'.")


def render_digits(num_samples: int, image_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """Procedural digits: uint8 images (N, 1, S, S) and labels (N,), a pure function of the seed.

    Each digit is drawn once per stroke width with Pillow's bundled scalable font, then every sample
    gets its own random affine (rotation, shear, scale, shift), blur and noise, all as batched
    tensor ops: 60k images at 32 px take a few seconds on one core.
    """
    gen = torch.Generator().manual_seed(seed)
    templates = _digit_templates(max(64, 2 * image_size))  # (10 * strokes, 1, T, T) in [0, 1]
    labels = torch.randint(0, NUM_DIGIT_CLASSES, (num_samples,), generator=gen)
    strokes = torch.randint(0, len(_STROKES), (num_samples,), generator=gen)
    chunks = []
    for start in range(0, num_samples, 4096):
        index = slice(start, start + 4096)
        batch = templates[labels[index] * len(_STROKES) + strokes[index]]
        chunks.append(_jitter(batch, image_size, gen))
    return torch.cat(chunks), labels


def _digit_templates(size: int) -> Tensor:
    try:
        font = ImageFont.load_default(size=int(size * 0.8))
    except ImportError as err:  # Pillow built without FreeType has only a fixed bitmap font
        raise DataError("data=digits needs Pillow with FreeType support (the PyPI wheels have it).") from err
    glyphs = []
    for digit in range(NUM_DIGIT_CLASSES):
        for stroke in _STROKES:
            canvas = Image.new("L", (size, size), 0)
            ImageDraw.Draw(canvas).text((size / 2, size / 2), str(digit), fill=255, font=font,
                                        anchor="mm", stroke_width=stroke * size // 64, stroke_fill=255)
            glyphs.append(torch.frombuffer(bytearray(canvas.tobytes()), dtype=torch.uint8).view(size, size))
    return torch.stack(glyphs).unsqueeze(1).float() / 255


def _jitter(templates: Tensor, image_size: int, gen: Tensor | torch.Generator) -> Tensor:
    """Random affine + blur + noise on a batch of templates -> uint8 images at image_size."""
    n = templates.size(0)

    def uniform(low: float, high: float) -> Tensor:
        return torch.empty(n).uniform_(low, high, generator=gen)

    angle = uniform(-0.25, 0.25)  # radians, about +-15 degrees
    shear = uniform(-0.25, 0.25)
    scale_x, scale_y = uniform(0.8, 1.05), uniform(0.72, 0.92)  # <1 zooms in, >1 out
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = torch.stack([
        torch.stack([cos * scale_x, (-sin + shear) * scale_y, uniform(-0.12, 0.12)], dim=1),
        torch.stack([sin * scale_x, cos * scale_y, uniform(-0.12, 0.12)], dim=1),
    ], dim=1)  # (N, 2, 3): output coordinates -> template coordinates, as affine_grid expects
    # Sample at twice the size and average-pool: a cheap anti-aliasing filter.
    grid = F.affine_grid(theta, [n, 1, 2 * image_size, 2 * image_size], align_corners=False)
    x = F.avg_pool2d(F.grid_sample(templates, grid, align_corners=False), 2)
    x = _gaussian_blur(x, sigma=uniform(0.01, 0.7) * image_size / 32)
    x = x * uniform(0.75, 1.0).view(n, 1, 1, 1)  # ink intensity
    x = x + torch.randn(x.shape, generator=gen) * uniform(0.0, 0.06).view(n, 1, 1, 1)
    return (x.clamp(0, 1) * 255).round().to(torch.uint8)


def _gaussian_blur(x: Tensor, sigma: Tensor) -> Tensor:
    """Separable Gaussian blur with one sigma per image (grouped conv over the batch)."""
    n, _, h, w = x.shape
    radius = max(1, math.ceil(2 * float(sigma.max())))
    offsets = torch.arange(-radius, radius + 1, dtype=x.dtype)
    kernel = torch.exp(-0.5 * (offsets.view(1, -1) / sigma.view(-1, 1)) ** 2)
    kernel = kernel / kernel.sum(dim=1, keepdim=True)  # (N, 2r+1)
    x = x.view(1, n, h, w)
    x = F.conv2d(F.pad(x, (radius, radius, 0, 0), mode="replicate"), kernel.view(n, 1, 1, -1), groups=n)
    x = F.conv2d(F.pad(x, (0, 0, radius, radius), mode="replicate"), kernel.view(n, 1, -1, 1), groups=n)
    return x.view(n, 1, h, w)


def to_unit_range(images: Tensor) -> Tensor:
    """uint8 [0, 255] -> float [-1, 1], the range of G's tanh."""
    return images.float().div_(127.5).sub_(1.0)


class EpochBatchSampler(Sampler[list[int]]):
    """Batches of indices over a fresh permutation per epoch, starting at any batch of any epoch.

    Epoch e visits the items in the order randperm(N) of a generator seeded with (seed, e): the
    order depends only on the seed and the position, so (epoch, batch) is the whole state of the
    data pipeline and a resumed run sees exactly the batches the uninterrupted run would have seen.
    It runs in the main process even when a DataLoader has workers, so workers change nothing.
    The last incomplete batch of an epoch is dropped: BatchNorm dislikes tiny batches.
    """

    def __init__(self, size: int, batch_size: int, seed: int):
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.epoch, self.start = 0, 0

    def __len__(self) -> int:
        return self.size // self.batch_size - self.start

    def __iter__(self) -> Iterator[list[int]]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=gen)
        for b in range(self.start, self.size // self.batch_size):
            yield order[b * self.batch_size:(b + 1) * self.batch_size].tolist()


class BatchStream:
    """Endless, resumable stream of float batches in [-1, 1] on the training device.

    num_workers=0: the uint8 images live on the device and a batch is one indexing op.
    num_workers>0: a DataLoader with worker processes reads the batches the sampler picks (the
    path for datasets too large to hold in memory), pinned for a fast copy to CUDA.
    """

    def __init__(self, images: Tensor, batch_size: int, seed: int, device: torch.device,
                 num_workers: int = 0):
        self.device = device
        self.sampler = EpochBatchSampler(images.size(0), batch_size, seed)
        if num_workers == 0:
            self.images: Optional[Tensor] = images.to(device)  # uint8: a quarter of float32's size
            self.loader: Optional[DataLoader] = None
        else:
            self.images = None
            self.loader = DataLoader(TensorDataset(images), batch_sampler=self.sampler,
                                     num_workers=num_workers, pin_memory=device.type == "cuda",
                                     persistent_workers=True)
        self.batch = 0  # batches taken in the current epoch
        self._batches = self._epoch_iterator()

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def _epoch_iterator(self) -> Iterator[Tensor]:
        if self.loader is None:
            return (self.images[torch.tensor(index, device=self.device)] for index in self.sampler)
        return (images for (images,) in self.loader)

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Tensor:
        try:
            images = next(self._batches)
        except StopIteration:  # end of epoch: the next one starts from its first batch
            self.sampler.epoch, self.sampler.start, self.batch = self.sampler.epoch + 1, 0, 0
            self._batches = self._epoch_iterator()
            images = next(self._batches)
        self.batch += 1
        return to_unit_range(images.to(self.device, non_blocking=True))

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.sampler.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.epoch, self.sampler.start = int(state["epoch"]), int(state["batch"])
        self.batch = self.sampler.start
        self._batches = self._epoch_iterator()
