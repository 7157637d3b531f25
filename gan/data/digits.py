"""The built-in dataset: digits 0-9 rendered with Pillow's bundled font, then jittered; no download."""

import math

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor

from gan.errors import DataError

NUM_DIGIT_CLASSES = 10
_STROKES = (1, 2, 3)  # extra stroke width in template pixels: thin, regular, bold


def render_digits(num_samples: int, image_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """A pure function of the seed: each digit drawn once per stroke, then a random affine, blur and noise."""
    gen = torch.Generator().manual_seed(seed)
    templates = _digit_templates(max(64, 2 * image_size))  # (10 * strokes, 1, T, T) in [0, 1]
    labels = torch.randint(0, NUM_DIGIT_CLASSES, (num_samples,), generator=gen)
    strokes = torch.randint(0, len(_STROKES), (num_samples,), generator=gen)
    picks = labels * len(_STROKES) + strokes  # each image's template
    chunks = [_jitter(templates[index], image_size, gen) for index in picks.split(4096)]
    return torch.cat(chunks), labels


def _digit_templates(size: int) -> Tensor:
    try:
        font = ImageFont.load_default(size=int(size * 0.8))
    except ImportError as err:  # Pillow built without FreeType has only a fixed bitmap font
        raise DataError("data=digits needs Pillow with FreeType support (the PyPI wheels have it).") from err
    style = {"fill": 255, "font": font, "anchor": "mm", "stroke_fill": 255}
    glyphs = []
    for digit in range(NUM_DIGIT_CLASSES):
        for stroke in _STROKES:
            canvas = Image.new("L", (size, size), 0)
            ImageDraw.Draw(canvas).text((size / 2, size / 2), str(digit), stroke_width=stroke * size // 64, **style)
            glyphs.append(torch.frombuffer(bytearray(canvas.tobytes()), dtype=torch.uint8).view(size, size))
    return torch.stack(glyphs).unsqueeze(1).float() / 255


def _jitter(templates: Tensor, image_size: int, gen: Tensor | torch.Generator) -> Tensor:
    n = templates.size(0)

    def uniform(low: float, high: float) -> Tensor:
        return torch.empty(n).uniform_(low, high, generator=gen)

    angle = uniform(-0.25, 0.25)  # radians, about +-15 degrees
    shear = uniform(-0.25, 0.25)
    scale_x, scale_y = uniform(0.8, 1.05), uniform(0.72, 0.92)  # <1 zooms in, >1 out
    cos, sin = torch.cos(angle), torch.sin(angle)
    row_x = torch.stack([cos * scale_x, (-sin + shear) * scale_y, uniform(-0.12, 0.12)], dim=1)
    row_y = torch.stack([sin * scale_x, cos * scale_y, uniform(-0.12, 0.12)], dim=1)
    theta = torch.stack([row_x, row_y], dim=1)  # (N, 2, 3): output coordinates -> template coordinates, for affine_grid
    # Sample at twice the size and average-pool: a cheap anti-aliasing filter.
    grid = F.affine_grid(theta, [n, 1, 2 * image_size, 2 * image_size], align_corners=False)
    x = F.avg_pool2d(F.grid_sample(templates, grid, align_corners=False), 2)
    x = _gaussian_blur(x, sigma=uniform(0.01, 0.7) * image_size / 32)
    x = x * uniform(0.75, 1.0).view(n, 1, 1, 1)  # ink intensity
    x = x + torch.randn(x.shape, generator=gen) * uniform(0.0, 0.06).view(n, 1, 1, 1)
    return (x.clamp(0, 1) * 255).round().to(torch.uint8)


def _gaussian_blur(x: Tensor, sigma: Tensor) -> Tensor:
    """One sigma per image (grouped conv over the batch)."""
    n, _, h, w = x.shape
    radius = max(1, math.ceil(2 * float(sigma.max())))
    offsets = torch.arange(-radius, radius + 1, dtype=x.dtype)
    kernel = torch.exp(-0.5 * (offsets.view(1, -1) / sigma.view(-1, 1)) ** 2)
    kernel = kernel / kernel.sum(dim=1, keepdim=True)  # (N, 2r+1)
    x = x.view(1, n, h, w)
    x = F.conv2d(F.pad(x, (radius, radius, 0, 0), mode="replicate"), kernel.view(n, 1, 1, -1), groups=n)
    x = F.conv2d(F.pad(x, (0, 0, radius, radius), mode="replicate"), kernel.view(n, 1, -1, 1), groups=n)
    return x.view(n, 1, h, w)
