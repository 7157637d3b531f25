"""An exponential moving average (EMA) of G's weights: the generator every sample is drawn from.
Why (Karras et al. 2018; Yazici et al. 2019): G's weights oscillate as G and D chase each other;
their running average sits near the middle and changes slowly (docs/results.md#training-tools)."""

from typing import Callable, Optional

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel

# AveragedModel's multi_avg_fn: (averaged tensors, current tensors, updates so far) -> None, in place
EmaUpdate = Callable[[list[Tensor], list[Tensor], Tensor], None]


def build_ema(
    G: nn.Module, decay: float, kimg: float = 0.0, rampup: float = 0.0, images_per_step: int = 1, every: int = 1
) -> Optional[AveragedModel]:
    """An exponential moving average of G (torch's AveragedModel), or None when it is off: `decay` with
    TF's warm-up, or, when kimg > 0, a half-life of kimg thousand images; updated every `every` steps.
    use_buffers=True averages BatchNorm's running statistics along with the weights."""
    if kimg <= 0 and decay <= 0:
        return None
    update = (
        ema_with_half_life(kimg * 1000, rampup, images_per_step, every) if kimg > 0 else ema_with_warmup(decay, every)
    )
    return AveragedModel(G, multi_avg_fn=update, use_buffers=True)


def ema_with_warmup(decay: float, every: int = 1) -> EmaUpdate:
    """EMA update whose decay warms up as TF's ExponentialMovingAverage(num_updates): min(decay,
    (1 + n) / (10 + n)) after n steps. With a fixed 0.999 the first few hundred steps' samples would
    still be mostly the random initial weights (0.999^300 = 74%)."""
    return _ema_update(lambda n: ((1 + n) / (10 + n)).clamp(max=decay), every)


def ema_with_half_life(half_life_images: float, rampup: float, images_per_step: int, every: int = 1) -> EmaUpdate:
    """EMA update with a half-life counted in images (StyleGAN2-ADA, training_loop.py): the decay per
    step is 0.5 ** (images_per_step / half-life), whatever the batch size; with rampup > 0 the
    half-life is at most rampup x the images seen so far, which plays the part of the warm-up."""

    def decay(n: Tensor) -> Tensor:
        half_life = torch.full_like(n, half_life_images, dtype=torch.float32)
        if rampup > 0:
            half_life = torch.minimum(half_life, rampup * (n.float() + 1) * images_per_step)
        return 0.5 ** (images_per_step / half_life)

    return _ema_update(decay, every)


def _ema_update(decay_after: Callable[[Tensor], Tensor], every: int = 1) -> EmaUpdate:
    """AveragedModel's multi_avg_fn: averaged = decay * averaged + (1 - decay) * current, the decay a function of the
    steps so far (a tensor on the device: no host sync). Updated every `every` steps, one update's decay is the product
    of the decays of the steps it stands for, so the average keeps its half-life in steps (exact while G holds still; as
    StyleGAN2-ADA's ema_kimg counts it in images)."""

    @torch.no_grad()
    def update(averaged: list[Tensor], current: list[Tensor], num_averaged: Tensor) -> None:
        if not averaged[0].is_floating_point():  # BatchNorm's num_batches_tracked: just follow G
            torch._foreach_copy_(averaged, current)
            return
        steps = num_averaged * every + torch.arange(every, device=num_averaged.device)  # the steps it stands for
        decay = decay_after(steps).prod().to(averaged[0].dtype)
        torch._foreach_lerp_(averaged, current, 1 - decay)

    return update
