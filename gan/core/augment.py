"""DiffAugment (Zhao et al. 2020, "Differentiable Augmentation for Data-Efficient GAN Training").

Why: on a few thousand images D memorises the training set and G's signal goes with it. DiffAugment applies the
same random transformations to every image D sees, real and fake, in both steps, so the augmentation cancels out of
the game. The fakes are augmented on their way into D in the G step, so the augmentations are differentiable tensor
ops: G's gradient flows back through them (an augmentation of uint8 pixels, a data loader's, would round that
gradient away).
The policies follow the paper's reference code (DiffAugment_pytorch.py), one random draw per image, from the
generator passed in (torch's global one when None)."""

from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

Augmentation = Callable[[Tensor, Optional[torch.Generator]], Tensor]


def _uniform(x: Tensor, generator: Optional[torch.Generator]) -> Tensor:
    """One U(0, 1) number per image, shaped (N, 1, 1, 1) to broadcast over its pixels."""
    return torch.rand(x.size(0), 1, 1, 1, dtype=x.dtype, device=x.device, generator=generator)


def _grid(n: int, h: int, w: int, device: torch.device) -> tuple[Tensor, ...]:
    """(image, row, column) indices of an (n, h, w) block."""
    return torch.meshgrid(*(torch.arange(size, device=device) for size in (n, h, w)), indexing="ij")


def brightness(x: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
    """Add one U(-0.5, 0.5) offset per image."""
    return x + (_uniform(x, generator) - 0.5)


def saturation(x: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
    """Scale each pixel's distance from its mean over channels by U(0, 2) (a no-op on grayscale)."""
    mean = x.mean(dim=1, keepdim=True)
    return (x - mean) * (_uniform(x, generator) * 2) + mean


def contrast(x: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
    """Scale each image's distance from its mean over all pixels by U(0.5, 1.5)."""
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return (x - mean) * (_uniform(x, generator) + 0.5) + mean


def color(x: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
    return contrast(saturation(brightness(x, generator), generator), generator)


def translation(x: Tensor, generator: Optional[torch.Generator] = None, ratio: float = 0.125) -> Tensor:
    """Shift each image by up to `ratio` of its side in each direction; zeros fill the border. A gather
    from the input padded by one zero pixel, not a roll: gradient flows back to the pixels read."""
    n, _, h, w = x.shape
    shift_h, shift_w = int(h * ratio + 0.5), int(w * ratio + 0.5)
    dx = torch.randint(-shift_h, shift_h + 1, (n, 1, 1), device=x.device, generator=generator)
    dy = torch.randint(-shift_w, shift_w + 1, (n, 1, 1), device=x.device, generator=generator)
    batch, rows, cols = _grid(n, h, w, x.device)
    rows, cols = torch.clamp(rows + dx + 1, 0, h + 1), torch.clamp(cols + dy + 1, 0, w + 1)
    return F.pad(x, [1, 1, 1, 1]).permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)


def cutout(x: Tensor, generator: Optional[torch.Generator] = None, ratio: float = 0.5) -> Tensor:
    """Set a square of `ratio` of the side to zero, centred anywhere in the image (clipped at its edges)."""
    n, _, h, w = x.shape
    size_h, size_w = int(h * ratio + 0.5), int(w * ratio + 0.5)
    offset_h = torch.randint(0, h + (1 - size_h % 2), (n, 1, 1), device=x.device, generator=generator)
    offset_w = torch.randint(0, w + (1 - size_w % 2), (n, 1, 1), device=x.device, generator=generator)
    batch, rows, cols = _grid(n, size_h, size_w, x.device)
    rows = torch.clamp(rows + offset_h - size_h // 2, 0, h - 1)
    cols = torch.clamp(cols + offset_w - size_w // 2, 0, w - 1)
    mask = torch.ones(n, h, w, dtype=x.dtype, device=x.device)
    mask[batch, rows, cols] = 0
    return x * mask.unsqueeze(1)  # a product with a constant mask: gradient 1 where kept, 0 where cut


# in the reference code's order, which diff_augment and AdaptiveAugment keep
POLICIES: dict[str, Augmentation] = {"color": color, "translation": translation, "cutout": cutout}


def diff_augment(x: Tensor, policies: Sequence[str], generator: Optional[torch.Generator] = None) -> Tensor:
    """x (N, C, H, W) through each of `policies`, in POLICIES' order; none returns x itself."""
    for name, augment in POLICIES.items():
        if name in policies:
            x = augment(x, generator)
    return x


class AdaptiveAugment:
    """DiffAugment whose strength follows D: each policy is applied to each image with probability p, and p is
    steered to hold ADA's overfitting heuristic r_t = E[sign(D(x))] near a target (StyleGAN2-ADA, Karras et al. 2020,
    sec. 3: "adaptive discriminator augmentation"). Every `interval` steps p moves by sign(mean r_t - target) x
    (images in those steps) / (speed_kimg x 1000); p starts at 0, a 0-dim tensor on the device. The host reads it
    once each time it moves (`p_now`), so at p = 0 no image is touched and nothing is drawn, on any device, at one
    device sync per `interval` steps. Its draws come from a generator of its own, which the checkpoint saves: the
    run's main stream does not depend on them."""

    def __init__(
        self,
        policies: Sequence[str],
        target: float,
        speed_kimg: float,
        batch_size: int,
        interval: int = 4,
        seed: int = 0,
    ):
        self.policies, self.target, self.interval, self.seed = list(policies), target, interval, seed
        self.step_size = interval * batch_size / (speed_kimg * 1000)
        self.p, self.p_now = torch.zeros(()), 0.0  # p_now: p as the host last read it
        self.rt_sum, self.seen = torch.zeros(()), 0
        self.generator = torch.Generator().manual_seed(seed)  # its state travels in the checkpoint's "rng"

    def to(self, device: torch.device) -> "AdaptiveAugment":
        self.p, self.rt_sum = self.p.to(device), self.rt_sum.to(device)
        self.generator = torch.Generator(device).manual_seed(self.seed)
        return self

    def __call__(self, x: Tensor) -> Tensor:
        if self.p_now == 0:  # no work and no draw, on every device (a GPU used to augment every image even at p = 0)
            return x
        for name, augment in POLICIES.items():
            if name not in self.policies:
                continue
            take = _uniform(x, self.generator) < self.p.to(x.dtype)  # (N, 1, 1, 1): this policy for these images
            if x.device.type == "cpu":
                # Reading the draws is free on the CPU, so only the images drawn are augmented: next to
                # nothing while p is small. index_put is differentiable: G's gradient reaches every image.
                index = take.flatten().nonzero().flatten()
                if index.numel() > 0:
                    x = x.index_put((index,), augment(x[index], self.generator))
            else:
                # On an accelerator reading the draws would wait for the device: augment all, keep the drawn ones
                x = torch.where(take, augment(x, self.generator), x)
        return x

    def state_dict(self) -> dict[str, float]:
        """p and the r_t gathered toward the next adjustment: a resume steers exactly as the run would have."""
        return {"p": float(self.p), "rt_sum": float(self.rt_sum), "seen": self.seen}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.set_p(state["p"])
        self.rt_sum.fill_(state["rt_sum"])
        self.seen = int(state["seen"])

    def observe(self, rt: Tensor, reduce: Callable[[Tensor], Tensor] = lambda t: t) -> None:
        """Once per step, with that step's r_t (a 0-dim tensor); every `interval` steps p moves.
        `reduce`: the mean over DDP ranks, so every rank steers the same p."""
        self.rt_sum += rt.detach().float()
        self.seen += 1
        if self.seen < self.interval:
            return
        self.p.add_(torch.sign(reduce(self.rt_sum / self.seen) - self.target) * self.step_size).clamp_(0, 1)
        self.p_now = float(self.p)  # the one host read: under DDP every rank reads the same, reduced p
        self.rt_sum.zero_()
        self.seen = 0

    def set_p(self, p: float) -> None:
        """p as a resume (or a test holding it fixed) sets it; observe() moves it in training."""
        self.p.fill_(p)
        self.p_now = float(self.p)


def no_augment(x: Tensor) -> Tensor:
    """The identity: what D sees when no augmentation is configured (the same tensor, no copy)."""
    return x
