"""Training tools for the results: penalties, spectral norm, PacGAN, label smoothing, TTUR, EMA."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import compose_config
from torch import nn

from gan.config import ConfigError
from gan.core.ema import build_ema, ema_with_half_life, ema_with_warmup
from gan.core.losses import d_loss_bce, gradient_penalty, r1_penalty
from gan.core.models import Discriminator, MinibatchStd
from gan.training import train
from gan.training.state import build_models, build_optimizer, lr_scale


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
    expected = -(
        0.9 * math.log(torch.sigmoid(torch.tensor(2.0)).item())
        + 0.1 * math.log(1 - torch.sigmoid(torch.tensor(2.0)).item())
    )
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


def test_spectral_norm_bounds_the_reshaped_matrix_not_the_convolution_on_images():
    """sigma = 1 for the (out, in*4*4) matrix; a 4x4 stride-2 convolution applies it to overlapping
    patches, each input pixel entering four of them, so on an image its gain can approach 2. A 1x1
    convolution (no overlap) stays within the bound."""
    torch.manual_seed(0)
    overlapping = nn.utils.parametrizations.spectral_norm(nn.Conv2d(1, 1, 4, stride=2, padding=1, bias=False))
    single = nn.utils.parametrizations.spectral_norm(nn.Conv2d(8, 4, 1, bias=False))
    with torch.no_grad():
        overlapping.parametrizations.weight.original.fill_(1.0)  # a spatially constant kernel: the worst case
        for conv in (overlapping, single):
            for _ in range(50):
                conv(torch.randn(1, conv.in_channels, 8, 8))  # power iterations converge to the true sigma
            conv.eval()  # from here on sigma stays as converged
        assert torch.linalg.matrix_norm(overlapping.weight.flatten(1), ord=2).item() == pytest.approx(1.0, abs=1e-3)
        flat = torch.ones(1, 1, 64, 64)
        assert (overlapping(flat).norm() / flat.norm()).item() > 1.8  # near 2: the per-layer bound is not 1
        gains = [(single(x).norm() / x.norm()).item() for x in torch.randn(20, 1, 8, 8, 8)]
        assert max(gains) <= 1.0 + 1e-3


def test_pack_judges_groups_of_samples():
    D = Discriminator(width=8, image_size=16, pack=2)
    assert D(torch.randn(8, 1, 16, 16)).shape == (4,)
    with pytest.raises(ConfigError, match="model.pack"):
        compose_config("model.pack=3")  # 32 images do not split into packs of 3


def test_minibatch_std_known_values():
    # 4 samples, groups of 2 in StyleGAN2-ADA's layout: {0, 2} and {1, 3}
    x = torch.stack([torch.full((3, 2, 2), v) for v in (0.0, 5.0, 2.0, 5.0)])
    out = MinibatchStd(group_size=2)(x)
    assert out.shape == (4, 4, 2, 2)
    torch.testing.assert_close(out[:, :3], x)  # the features pass through
    extra = out[:, 3, 0, 0]
    assert extra[0].item() == pytest.approx(1.0) and extra[2].item() == pytest.approx(1.0)  # std of 0 and 2
    assert extra[1].item() == pytest.approx(1e-4) and extra[3].item() == pytest.approx(1e-4)  # sqrt(0 + eps)
    assert (out[:, 3] == extra.view(4, 1, 1)).all()  # one constant channel per sample


def test_minibatch_std_lets_d_see_a_collapsed_batch():
    layer = MinibatchStd(group_size=4)
    varied, collapsed = torch.randn(8, 16, 4, 4), torch.randn(1, 16, 4, 4).expand(8, 16, 4, 4)
    assert layer(varied)[:, -1].min() > 0.5 and layer(collapsed)[:, -1].max() < 1e-3
    # the channel couples the samples of a group and only those: a sample's gradient reaches its
    # group mates (n, n + 2, n + 4, n + 6 for 8 samples in groups of 4), never the other group
    x = torch.randn(8, 16, 4, 4, requires_grad=True)
    layer(x)[0, -1].sum().backward()
    touched = x.grad.flatten(1).abs().sum(1) > 0
    assert touched.tolist() == [True, False, True, False, True, False, True, False]
    assert MinibatchStd(group_size=4)(torch.randn(6, 2, 4, 4)).shape == (6, 3, 4, 4)  # gcd(6, 4) = 2


def test_minibatch_std_in_discriminator():
    D = Discriminator(width=8, image_size=16, minibatch_std=4)
    assert D.head.in_channels == 8 * 2 + 1 and D(torch.randn(8, 1, 16, 16)).shape == (8,)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(D(torch.randn(8, 1, 16, 16)).float()).all()
    with pytest.raises(ConfigError, match="model.minibatch_std"):
        compose_config("model.minibatch_std=-1")


def test_per_sample_penalties_refuse_batchnorm():
    with pytest.raises(ConfigError, match="model.d_batchnorm"):
        compose_config("loss.r1=1.0", "model.d_batchnorm=true")
    assert compose_config("loss.r1=1.0").loss.r1 == 1.0  # the default D has no BatchNorm
    cfg = compose_config("experiment=wgan_gp")  # the recipe turns BatchNorm off with the loss
    assert not cfg.model.d_batchnorm and cfg.loss.gradient_penalty == 10.0 and cfg.optim.beta1 == 0.0


def test_ttur_gives_d_its_own_learning_rate():
    cfg = compose_config("optim.lr=1e-4", "optim.lr_d=4e-4")
    G, D = build_models(cfg, torch.device("cpu"))
    opt_d = build_optimizer(D, cfg, torch.device("cpu"), lr=cfg.optim.lr_d)
    assert opt_d.param_groups[0]["lr"] == 4e-4
    assert build_optimizer(G, cfg, torch.device("cpu")).param_groups[0]["lr"] == 1e-4


def test_learning_rates_are_constant_then_fall_linearly_to_near_zero():
    # 10 steps, the last half decaying: updates 1-6 at full rate (the 6th is 5/5), then 4/5, ..., 1/5
    scales = [lr_scale(step, 10, 0.5) for step in range(10)]
    assert scales == pytest.approx([1, 1, 1, 1, 1, 1, 0.8, 0.6, 0.4, 0.2])
    assert [lr_scale(step, 10, 0.0) for step in range(10)] == [1.0] * 10  # 0: constant
    assert lr_scale(0, 4, 1.0) == 1 and lr_scale(3, 4, 1.0) == pytest.approx(0.25)  # the whole run
    with pytest.raises(ConfigError, match="optim.lr_decay"):
        compose_config("optim.lr_decay=1.5")


def test_both_optimizers_follow_the_schedule_in_training(tmp_path):
    cfg = compose_config("trainer.max_steps=4", "optim.lr=1e-3", "optim.lr_d=4e-3", "optim.lr_decay=0.5")
    seen = []
    train(cfg, tmp_path / "run", after_step=lambda s: seen.append((s.opt_g.param_groups[0]["lr"],
                                                                    s.opt_d.param_groups[0]["lr"])))  # fmt: skip
    # the rate of each update 1..4: full, full, full, then half (update 4 after 3 of 4 steps: 1/2)
    assert seen == [pytest.approx((g, 4 * g)) for g in (1e-3, 1e-3, 1e-3, 5e-4)]


def test_ema_decay_warms_up():
    G = nn.Linear(1, 1, bias=False)
    ema = build_ema(G, decay=0.999)
    with torch.no_grad():
        G.weight.fill_(0.0)
        ema.update_parameters(G)  # n = 0: a copy
        G.weight.fill_(1.0)
        ema.update_parameters(G)  # n = 1: decay (1 + 1) / (10 + 1) = 2/11, not 0.999
    assert ema.module.weight.item() == pytest.approx(1 - 2 / 11)


def test_ema_half_life_in_images():
    # 100 images per step, a half-life of 1,000 images: after the ramp-up each step keeps
    # 0.5 ** (100 / 1000) of the average, so 10 steps of a new value close half the gap
    G = nn.Linear(1, 1, bias=False)
    ema = build_ema(G, decay=0.0, kimg=1.0, rampup=0.0, images_per_step=100)
    with torch.no_grad():
        G.weight.fill_(0.0)
        ema.update_parameters(G)  # n = 0: a copy
        G.weight.fill_(1.0)
        for _ in range(10):
            ema.update_parameters(G)
    assert ema.module.weight.item() == pytest.approx(0.5, abs=1e-5)
    # ramp-up 0.5: after n updates the half-life is at most 0.5 (n + 1) x 100 images, so the
    # second update (n = 1) keeps 0.5 ** (100 / 100) = 0.5, not 0.5 ** 0.1
    ramped = build_ema(G, decay=0.0, kimg=1.0, rampup=0.5, images_per_step=100)
    with torch.no_grad():
        G.weight.fill_(0.0)
        ramped.update_parameters(G)
        G.weight.fill_(1.0)
        ramped.update_parameters(G)
    assert ramped.module.weight.item() == pytest.approx(0.5, abs=1e-6)
    cfg = compose_config("model.ema_kimg=10", "model.ema_decay=0")  # kimg alone turns the EMA on
    assert build_ema(G, cfg.model.ema_decay, cfg.model.ema_kimg, cfg.model.ema_rampup) is not None
    with pytest.raises(ConfigError, match="model.ema_kimg"):
        compose_config("model.ema_kimg=-1")


@pytest.mark.parametrize("every", [2, 4, 7])
@pytest.mark.parametrize("kind", ["warm-up", "half-life"])
def test_an_ema_updated_every_k_steps_keeps_its_half_life(kind, every):
    def update(k: int):
        return ema_with_warmup(0.999, k) if kind == "warm-up" else ema_with_half_life(1000.0, 0.05, 64, k)

    single, cadenced, current = update(1), update(every), [torch.ones(3)]
    # G holding still: one update every k steps lands where the k single-step updates it stands for do,
    # in the warm-up (or ramp-up) and after it. After n updates it stands for steps n * k ... n * k + k - 1.
    for n in (1, 2, 5, 40, 3000):
        steps, once = [torch.zeros(3)], [torch.zeros(3)]
        for step in range(n * every, n * every + every):
            single(steps, current, torch.tensor(step))
        cadenced(once, current, torch.tensor(n))
        torch.testing.assert_close(once[0], steps[0])
    # past the warm-up each update keeps decay ** k of the average: the half-life in steps is unchanged
    per_step = 0.999 if kind == "warm-up" else 0.5 ** (64 / 1000)
    late = [torch.zeros(1)]
    cadenced(late, [torch.ones(1)], torch.tensor(10**6))
    assert late[0].item() == pytest.approx(1 - per_step**every, abs=1e-6)  # float32 arithmetic


def test_the_loop_updates_the_ema_every_model_ema_every_steps(tmp_path):
    seen = []
    train(compose_config("trainer.max_steps=7", "model.ema_every=3"), tmp_path / "run",
          after_step=lambda state: seen.append(int(state.G_ema.n_averaged)))  # fmt: skip
    assert seen == [0, 0, 1, 1, 1, 2, 2]  # after steps 3 and 6 (the first update copies G)
    with pytest.raises(ConfigError, match="model.ema_every"):
        compose_config("model.ema_every=0")


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


@pytest.mark.parametrize(
    "overrides",
    [
        ["experiment=wgan_gp"],
        ["loss=hinge", "model.spectral_norm=true", "model.d_batchnorm=false"],
        ["model.pack=2", "loss.real_label=0.9", "optim.lr_d=4e-4"],
        ["model.minibatch_std=4", "model.pack=2"],
        ["loss.r1=1.0", "model.d_batchnorm=false"],
        ["model.ema_decay=0"],
        ["model.ema_kimg=1"],
    ],
)
def test_tools_train(tmp_path, overrides):
    result = train(compose_config("trainer.max_steps=3", *overrides), tmp_path)
    assert result.step == 3
    assert all(math.isfinite(v) for v in result.metrics.values())
