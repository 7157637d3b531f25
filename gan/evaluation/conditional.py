"""A class-conditional G: `cond_accuracy` (obedience to y, not quality), intra-class FID (StudioGAN's), class grid."""

import logging
from typing import Any, Optional

import torch
from torch import Tensor, nn

from gan.core.sampling import class_rows, image_grid, sample
from gan.errors import ConfigError
from gan.evaluation import metrics as M

log = logging.getLogger(__name__)

# Intra-class FID needs this many images per class, and d + 1 (else the covariance is singular).
MIN_PER_CLASS = 200


def check_class_id(class_id: Optional[int], num_classes: int, source: str) -> None:
    if class_id is None:
        return
    if not num_classes:
        raise ConfigError(
            f"class_id={class_id} asks for one class, but {source} holds an unconditional generator, which cannot "
            "be told a class. Leave class_id out, or use a checkpoint of a run with model.conditional=true."
        )
    if not 0 <= class_id < num_classes:
        raise ConfigError(
            f"class_id={class_id} is out of range: the generator in {source} knows {num_classes} classes, "
            f"numbered 0 to {num_classes - 1}."
        )


def sample_classes(reference_labels: Tensor, count: int, class_id: Optional[int], seed: int) -> Tensor:
    """`class_id` for all, or the held-out images' own labels, so FID compares the same class mix."""
    if class_id is not None:
        return torch.full((count,), class_id, dtype=torch.long)
    if count <= reference_labels.numel():
        return reference_labels[:count].clone()
    index = torch.randint(reference_labels.numel(), (count,), generator=torch.Generator().manual_seed(seed))
    return reference_labels[index]


def conditional_metrics(
    classifier: M.Classifier,
    fake: Tensor,
    requested: Tensor,
    real_features: Tensor,
    real_labels: Tensor,
    fake_features: Tensor,
    batch_size: int,
    device: torch.device,
    per_channel: bool = False,
    intra_fid: bool = True,
) -> dict[str, Any]:
    """`per_channel`: Stacked-MNIST, read digit by digit as the class histogram is."""
    predicted = M.predict(classifier, fake, batch_size, device, per_channel=per_channel)
    results: dict[str, Any] = {"cond_accuracy": float((predicted == requested).float().mean())}
    if not intra_fid:
        return results
    per_class: dict[int, float] = {}
    needed = max(MIN_PER_CLASS, real_features.size(1) + 1)
    for c in requested.unique().tolist():
        reals, fakes = real_features[real_labels == c], fake_features[requested == c]
        if min(reals.size(0), fakes.size(0)) < needed:
            log.info("Intra-class FID left out: class %d has %d real and %d generated images (< %d).",
                     c, reals.size(0), fakes.size(0), needed)  # fmt: skip
            return {**results, "intra_fid": None}
        per_class[c] = M.fid(reals, fakes)
    values = list(per_class.values())
    results.update(intra_fid=sum(values) / len(values), intra_fid_min=min(values), intra_fid_max=max(values))
    results["intra_fid_per_class"] = {str(c): round(v, 4) for c, v in per_class.items()}
    return results


def class_grid(G: nn.Module, columns: int, seed: int, device: torch.device) -> Tensor:
    """One row per class (at most 16), the same `columns` latents in every row."""
    latents = torch.randn(columns**2, G.z_dim, generator=torch.Generator().manual_seed(seed + 2))
    z, y = class_rows(latents, G.num_classes)  # the first ceil(sqrt(N)) = `columns` latents, each row
    return image_grid(sample(G, z.to(device), y.to(device)), nrow=columns)


class LabelledLatents(nn.Module):
    """G(z, y) with y as z's last column: update_bn passes a model only one input."""

    def __init__(self, G: nn.Module):
        super().__init__()
        self.G = G
        self.train(G.training)  # update_bn puts back this module's mode, which must be G's (eval when measured)

    def forward(self, zy: Tensor) -> Tensor:
        return self.G(zy[:, :-1], zy[:, -1].long())
