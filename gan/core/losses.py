"""Adversarial losses and regularisers as pure functions of D's logits (D has no Sigmoid), each a
scalar to minimise: with-logits rewrites of the textbook formulas, which never take log(0)."""

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


def d_loss_bce(real_logits: Tensor, fake_logits: Tensor, real_label: float = 1.0) -> Tensor:
    """-[log D(x) + log(1 - D(G(z)))], the GAN discriminator loss (Goodfellow et al. 2014).
    real_label < 1 is one-sided label smoothing (Salimans et al. 2016, sec. 3.4): D aims at 0.9, say,
    for real images, which keeps it from growing overconfident; fakes keep the target 0."""
    real = F.binary_cross_entropy_with_logits(real_logits, torch.full_like(real_logits, real_label))  # -log sigmoid(l)
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


def d_loss_wgan(real_logits: Tensor, fake_logits: Tensor) -> Tensor:
    """E[D(G(z))] - E[D(x)]: the critic's side of the Wasserstein loss (Arjovsky et al. 2017)."""
    return fake_logits.mean() - real_logits.mean()


def gradient_penalty(critic: Callable[[Tensor], Tensor], real: Tensor, fake: Tensor) -> Tensor:
    """E[(||grad_x D(x_hat)||_2 - 1)^2] on random interpolates of real and fake (Gulrajani et al. 2017).
    create_graph=True: the penalty's gradient with respect to D's weights needs the graph of D's input
    gradient (a second-order backward); without it the penalty changes nothing. The norm is per
    sample, so D must not mix samples (no BatchNorm). `fake` must come detached, or the penalty's
    gradient would reach G; `real` is detached here (under R1 it requires grad: no .grad filled for nothing)."""
    epsilon = torch.rand(real.size(0), 1, 1, 1, device=real.device, dtype=real.dtype)
    interpolates = (epsilon * real.detach() + (1 - epsilon) * fake).requires_grad_(True)
    (grad,) = torch.autograd.grad(critic(interpolates).sum(), interpolates, create_graph=True)
    return (grad.flatten(1).norm(2, dim=1) - 1).pow(2).mean()


def r1_penalty(real_logits: Tensor, real: Tensor) -> Tensor:
    """E[||grad_x D(x)||^2] on real images (Mescheder et al. 2018); `real` must require grad."""
    (grad,) = torch.autograd.grad(real_logits.sum(), real, create_graph=True)
    return grad.flatten(1).pow(2).sum(1).mean()


def feature_matching(real_features: Tensor, fake_features: Tensor) -> Tensor:
    """||E f(x) - E f(G(z))||^2 over D's features (Salimans et al. 2016, sec. 3.1); real ones detached."""
    return (real_features.mean(0) - fake_features.mean(0)).pow(2).mean()


def probabilities(real_logits: Tensor, fake_logits: Tensor) -> dict[str, Tensor]:
    """Mean D(x) and D(G(z)) as probabilities of "real": near 1 and 0 for long, D wins and G learns
    little (pytorch/examples#822)."""
    return {"d/real": torch.sigmoid(real_logits).mean(), "d/fake": torch.sigmoid(fake_logits).mean()}


def mean_scores(real_logits: Tensor, fake_logits: Tensor) -> dict[str, Tensor]:
    """Mean raw scores of D on real and fake images (a hinge D or a Wasserstein critic outputs no
    probability; for WGAN their gap estimates the Wasserstein distance), and bce's probabilities."""
    return {**probabilities(real_logits, fake_logits), "d/real_score": real_logits.mean(),
            "d/fake_score": fake_logits.mean()}  # fmt: skip


class AdversarialLoss(NamedTuple):
    d: Callable[[Tensor, Tensor], Tensor]  # (real_logits, fake_logits) -> D's loss
    g: Callable[[Tensor], Tensor]  # fake_logits -> G's loss
    # (real_logits, fake_logits) -> the diagnostics of D's outputs that mean something for this loss
    scores: Callable[[Tensor, Tensor], dict[str, Tensor]] = probabilities


LOSSES: dict[str, AdversarialLoss] = {
    "bce": AdversarialLoss(d_loss_bce, g_loss_bce, probabilities),
    "hinge": AdversarialLoss(d_loss_hinge, g_loss_hinge, mean_scores),
    "wgan_gp": AdversarialLoss(d_loss_wgan, g_loss_hinge, mean_scores),  # G: -E[D(G(z))], the same form as hinge's
}
