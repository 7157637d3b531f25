"""Pictures of a generator: latent interpolations and the nearest-neighbour memorisation check."""

from typing import Optional

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from gan.config import DataConfig
from gan.core.sampling import image_grid, sample
from gan.data import load_dataset, to_unit_range


def slerp(z0: Tensor, z1: Tensor, t: Tensor) -> Tensor:
    """(R, D), (R, D), (T,) -> (R, T, D) (White 2016): latents lie near a sphere; a line cuts inside, unseen by G."""
    u0, u1 = z0 / z0.norm(dim=-1, keepdim=True), z1 / z1.norm(dim=-1, keepdim=True)
    omega = torch.acos((u0 * u1).sum(dim=-1).clamp(-1, 1))[:, None, None]  # (R, 1, 1)
    t = t[None, :, None]  # (1, T, 1)
    sin = torch.sin(omega)
    near = sin.abs() < 1e-6  # (almost) parallel: the arc is a line
    w0 = torch.where(near, 1 - t, torch.sin((1 - t) * omega) / torch.where(near, 1.0, sin))
    w1 = torch.where(near, t, torch.sin(t * omega) / torch.where(near, 1.0, sin))
    return w0 * z0[:, None] + w1 * z1[:, None]


def interpolation_strip(
    G: nn.Module, rows: int, steps: int, seed: int, device: torch.device, classes: Optional[list[int]] = None
) -> Tensor:
    """One row per pair of random latents; conditional G: row r drawn as classes[r]."""
    gen = torch.Generator().manual_seed(seed + 1)
    z0, z1 = torch.randn(2, rows, G.z_dim, generator=gen)
    z = slerp(z0, z1, torch.linspace(0, 1, steps)).reshape(rows * steps, G.z_dim)
    y = None if classes is None else torch.tensor(classes, device=device).repeat_interleave(steps)
    return image_grid(sample(G, z.to(device), y), nrow=steps)


def neighbour_grid(queries: Tensor, data: DataConfig, k: int) -> Tensor:
    """Each query, then its k nearest training images (pixel L2); chunked, so a streamed dataset need not fit."""
    training = load_dataset(data, train=True).images
    flat = queries.float().flatten(1)
    best_distance = torch.full((queries.size(0), k), float("inf"))
    best_index = torch.zeros(queries.size(0), k, dtype=torch.long)
    start = 0
    chunks = training.split(4096) if isinstance(training, Tensor) else DataLoader(training, batch_size=4096)
    for chunk in chunks:
        distance = torch.cdist(flat, chunk.float().flatten(1))
        indices = torch.cat([best_index, torch.arange(start, start + chunk.size(0)).expand_as(distance)], dim=1)
        best_distance, order = torch.cat([best_distance, distance], dim=1).topk(k, dim=1, largest=False)
        best_index = indices.gather(1, order)
        start += chunk.size(0)
    neighbours = torch.stack([training[int(i)] for i in best_index.flatten()]).unflatten(0, best_index.shape)
    rows = torch.cat([queries[:, None], neighbours], dim=1).flatten(0, 1)
    return image_grid(to_unit_range(rows), nrow=k + 1)
