"""Adversarial losses and regularisers as pure functions of D's outputs.

Owns the math only: no optimizer, no module, no state. Every function takes logits (D has no
Sigmoid) and returns a scalar to minimise. The with-logits forms are exact rewrites of the
textbook formulas that never take log(0) and stay correct under autocast.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


def d_loss_bce(real_logits: Tensor, fake_logits: Tensor) -> Tensor:
    """-[log D(x) + log(1 - D(G(z)))], the GAN discriminator loss (Goodfellow et al. 2014)."""
    real = F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))  # -log sigmoid(l)
    fake = F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))  # -log(1 - sigmoid(l))
    return real + fake


def g_loss_bce(fake_logits: Tensor) -> Tensor:
    """-log D(G(z)): the non-saturating G loss; log(1 - D(G(z))) has vanishing gradient early on."""
    return F.softplus(-fake_logits).mean()  # softplus(-l) = -log(sigmoid(l))


def d_loss_hinge(real_logits: Tensor, fake_logits: Tensor) -> Tensor:
    """relu(1 - D(x)) + relu(1 + D(G(z))) (Lim & Ye 2017)."""
    return F.relu(1.0 - real_logits).mean() + F.relu(1.0 + fake_logits).mean()


def g_loss_hinge(fake_logits: Tensor) -> Tensor:
    """-D(G(z))."""
    return -fake_logits.mean()


def feature_matching(real_features: Tensor, fake_features: Tensor) -> Tensor:
    """||E f(x) - E f(G(z))||^2 over D's intermediate features (Salimans et al. 2016, sec. 3.1).

    The real statistics are constants for G: pass them detached.
    """
    return (real_features.mean(0) - fake_features.mean(0)).pow(2).mean()


class AdversarialLoss(NamedTuple):
    d: Callable[[Tensor, Tensor], Tensor]  # (real_logits, fake_logits) -> D's loss
    g: Callable[[Tensor], Tensor]  # fake_logits -> G's loss


LOSSES: dict[str, AdversarialLoss] = {
    "bce": AdversarialLoss(d_loss_bce, g_loss_bce),
    "hinge": AdversarialLoss(d_loss_hinge, g_loss_hinge),
}

