"""Training tools for the results: penalties, spectral norm, PacGAN, label smoothing, TTUR, EMA."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import compose_config
from gan.config import ConfigError
from gan.losses import d_loss_bce, gradient_penalty, r1_penalty
from gan.models import Discriminator
from gan.training import build_ema, build_models, build_optimizer, train


class LinearCritic(nn.Module):
    """D(x) = <w, x>: its input gradient is w for every sample, so the penalties have closed forms."""

    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(w)

    def forward(self, x):
        return (x.flatten(1) * self.w.flatten()).sum(1)


def test_gradient_penalty_closed_form_and_second_order_gradient():
    w = torch.full((1, 4, 4), 0.5)  # ||w|| = 0.5 * 4 = 2
    critic = LinearCritic(w)
    penalty = gradient_penalty(critic, torch.randn(8, 1, 4, 4), torch.randn(8, 1, 4, 4))
    assert penalty.item() == pytest.approx((2.0 - 1.0) ** 2)
    penalty.backward()  # reaches the weights only because the input gradient kept its graph
    # d/dw (||w|| - 1)^2 = 2 (||w|| - 1) w / ||w||
    torch.testing.assert_close(critic.w.grad, 2 * (2.0 - 1.0) * w / 2.0)


def test_r1_penalty_closed_form():
    critic = LinearCritic(torch.full((1, 4, 4), 0.5))
    real = torch.randn(8, 1, 4, 4, requires_grad=True)
    assert r1_penalty(critic(real), real).item() == pytest.approx(4.0)  # ||w||^2


def test_one_sided_label_smoothing_known_value():
    logits = torch.full((4,), 2.0)
    expected = -(0.9 * math.log(torch.sigmoid(torch.tensor(2.0)).item())
                 + 0.1 * math.log(1 - torch.sigmoid(torch.tensor(2.0)).item()))
    fake_term = -math.log(1 - torch.sigmoid(torch.tensor(-3.0)).item())
    value = d_loss_bce(logits, torch.full((4,), -3.0), real_label=0.9).item()
    assert value == pytest.approx(expected + fake_term, rel=1e-6)


def test_spectral_norm_bounds_each_convolution():
    D = Discriminator(width=8, image_size=16, batchnorm=False, spectral_norm=True)
    for _ in range(20):  # one power iteration per training forward
        D(torch.randn(4, 1, 16, 16))
    for conv in [m for m in D.modules() if isinstance(m, nn.Conv2d)]:
        sigma = torch.linalg.matrix_norm(conv.weight.flatten(1), ord=2)
        assert sigma.item() == pytest.approx(1.0, abs=0.05)


def test_pack_judges_groups_of_samples():
    D = Discriminator(width=8, image_size=16, pack=2)
    assert D(torch.randn(8, 1, 16, 16)).shape == (4,)
    with pytest.raises(ConfigError, match="model.pack"):
        compose_config("model.pack=3")  # 32 images do not split into packs of 3


def test_per_sample_penalties_refuse_batchnorm():
    with pytest.raises(ConfigError, match="model.d_batchnorm"):
        compose_config("loss.r1=1.0")
    cfg = compose_config("loss=wgan_gp")  # the recipe turns BatchNorm off itself
    assert not cfg.model.d_batchnorm and cfg.loss.gradient_penalty == 10.0 and cfg.optim.beta1 == 0.0


def test_ttur_gives_d_its_own_learning_rate():
    cfg = compose_config("optim.lr=1e-4", "optim.lr_d=4e-4")
    G, D = build_models(cfg, torch.device("cpu"))
    opt_d = build_optimizer(D, cfg, torch.device("cpu"), lr=cfg.optim.lr_d)
    assert opt_d.param_groups[0]["lr"] == 4e-4
    assert build_optimizer(G, cfg, torch.device("cpu")).param_groups[0]["lr"] == 1e-4


def test_ema_decay_warms_up():
    G = nn.Linear(1, 1, bias=False)
    ema = build_ema(G, decay=0.999)
    with torch.no_grad():
        G.weight.fill_(0.0)
        ema.update_parameters(G)  # n = 0: a copy
        G.weight.fill_(1.0)
        ema.update_parameters(G)  # n = 1: decay (1 + 1) / (10 + 1) = 2/11, not 0.999
    assert ema.module.weight.item() == pytest.approx(1 - 2 / 11)


def test_ema_averages_weights_and_batchnorm_statistics():
    cfg = compose_config()
    G, _ = build_models(cfg, torch.device("cpu"))
    ema = build_ema(G, decay=0.5)
    for _ in range(20):  # past the warm-up: (1 + n) / (10 + n) > 0.5 from n = 9 on
        ema.update_parameters(G)
    before = [t.clone() for t in ema.module.state_dict().values() if t.is_floating_point()]
    with torch.no_grad():
        for p in G.parameters():
            p.add_(1.0)
        G(torch.randn(8, cfg.model.z_dim))  # moves BatchNorm's running statistics
    ema.update_parameters(G)
    after = [t for t in ema.module.state_dict().values() if t.is_floating_point()]
    current = [t for t in G.state_dict().values() if t.is_floating_point()]
    for b, a, c in zip(before, after, current):
        torch.testing.assert_close(a, 0.5 * b + 0.5 * c)


@pytest.mark.parametrize("overrides", [
    ["loss=wgan_gp"],
    ["loss=hinge", "model.spectral_norm=true", "model.d_batchnorm=false"],
    ["model.pack=2", "loss.real_label=0.9", "optim.lr_d=4e-4"],
    ["loss.r1=1.0", "model.d_batchnorm=false"],
    ["model.ema_decay=0"],
])
def test_tools_train(tmp_path, overrides):
    result = train(compose_config("trainer.max_steps=3", *overrides), tmp_path)
    assert result.step == 3
    assert all(math.isfinite(v) for v in result.metrics.values())
