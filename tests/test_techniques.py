"""Invariants tier: each technique of the training step, proven on real G and D.

Every test that shows a technique also shows what goes wrong without it, so it fails if the
technique is removed from gan/core/steps.py or gan/core/sampling.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gan.config import BackwardMode, ConfigError
from gan.core.losses import LOSSES
from gan.core.sampling import eval_mode, sample
from gan.core.steps import StepContext, backward_terms, d_step, frozen, g_step, release_grads
from gan.device import resolve_device
from gan.training.checkpoint import load_checkpoint, save_checkpoint

BCE = LOSSES["bce"]


def adam(module: nn.Module) -> torch.optim.Adam:
    return torch.optim.Adam(module.parameters(), lr=1e-2, betas=(0.5, 0.999))


def snapshot(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def batch(G, n=16):
    real = torch.rand(n, 1, 16, 16) * 2 - 1
    fake = G(torch.randn(n, 16))
    return real, fake


# 1. D step on fake.detach() ------------------------------------------------------------------


def test_d_step_leaves_generator_gradients_none(tiny_gan):
    G, D = tiny_gan
    real, fake = batch(G)
    d_before = snapshot(D)
    d_step(D, adam(D), real, fake)
    assert all(p.grad is None for p in G.parameters())
    assert all(p.grad is None for p in D.parameters())  # released after the update
    assert any(not torch.equal(a, b) for a, b in zip(d_before, D.parameters()))  # D did learn


def test_without_detach_d_loss_reaches_generator(tiny_gan):
    G, D = tiny_gan
    real, fake = batch(G)
    BCE.d(D(real), D(fake)).backward()  # what d_step would do without .detach()
    assert all(p.grad is not None for p in G.parameters())


# 2. D frozen with requires_grad_(False) during the G step ------------------------------------


def test_g_step_leaves_discriminator_untouched(tiny_gan):
    G, D = tiny_gan
    real, fake = batch(G)
    _, real_features = d_step(D, adam(D), real, fake)
    d_before, g_before = snapshot(D), snapshot(G)
    g_step(D, G, adam(G), fake, real_features)
    assert all(p.grad is None for p in D.parameters())
    assert all(torch.equal(a, b) for a, b in zip(d_before, D.parameters()))
    assert all(p.requires_grad for p in D.parameters())  # unfrozen after
    assert all(p.grad is None for p in G.parameters())  # released after the update
    assert any(not torch.equal(a, b) for a, b in zip(g_before, G.parameters()))  # G did learn


def test_without_freezing_g_loss_fills_discriminator_grads(tiny_gan):
    G, D = tiny_gan
    _, fake = batch(G)
    BCE.g(D(fake)).backward()  # the canonical example's G step (pytorch/examples#361)
    assert all(p.grad is not None for p in D.parameters())


def test_frozen_restores_each_flag_even_on_error(tiny_gan):
    _, D = tiny_gan
    head = D.head.weight
    head.requires_grad_(False)  # a parameter frozen on purpose stays frozen
    with pytest.raises(RuntimeError, match="boom"), frozen(D):
        assert not any(p.requires_grad for p in D.parameters())
        raise RuntimeError("boom")
    assert not head.requires_grad
    assert all(p.requires_grad for p in D.features.parameters())


def test_frozen_discriminator_still_passes_gradient_to_its_input(tiny_gan):
    _, D = tiny_gan
    x = torch.randn(4, 1, 16, 16, requires_grad=True)
    with frozen(D):
        D(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


# 3. Multi-loss G objective and retain_graph ---------------------------------------------------


def two_term_objective(G, D, real):
    fake = G(torch.randn(real.size(0), 16))
    with frozen(D):
        logits, features = D(fake, with_features=True)
        _, real_features = D(real, with_features=True)
    from gan.core.losses import feature_matching

    return {"adv": BCE.g(logits), "fm": 10 * feature_matching(real_features.detach(), features)}


def test_summed_and_separate_backward_give_the_same_gradients(tiny_gan):
    G, D = tiny_gan
    real = torch.rand(16, 1, 16, 16) * 2 - 1
    grads = {}
    for mode in BackwardMode:
        G_copy = copy.deepcopy(G)
        torch.manual_seed(1)
        norms = backward_terms(two_term_objective(G_copy, D, real), list(G_copy.parameters()), mode)
        grads[mode] = [p.grad.clone() for p in G_copy.parameters()]
        assert set(norms) == (set() if mode == BackwardMode.summed else {"adv", "fm"})
    for a, b in zip(grads[BackwardMode.summed], grads[BackwardMode.separate]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_second_backward_without_retain_graph_raises(tiny_gan):
    G, D = tiny_gan
    terms = two_term_objective(G, D, torch.rand(16, 1, 16, 16))
    terms["adv"].backward()  # frees the saved tensors of the graph shared with "fm"
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        terms["fm"].backward()


def test_g_step_logs_each_term_in_separate_mode(tiny_gan):
    G, D = tiny_gan
    real, fake = batch(G)
    _, real_features = d_step(D, adam(D), real, fake)
    ctx = StepContext(feature_matching=1.0, backward_mode=BackwardMode.separate)
    stats = g_step(D, G, adam(G), fake, real_features, ctx)
    assert {"loss/g_adv", "loss/g_fm", "grad_norm/g_adv", "grad_norm/g_fm"} <= set(stats)
    assert stats["loss/g"].item() == pytest.approx((stats["loss/g_adv"] + stats["loss/g_fm"]).item())
    assert stats["grad_norm/images"].item() > 0  # retain_grad() kept the gradient at the images


# 4. Zeroing by param.grad = None ------------------------------------------------------------


def test_release_grads_sets_none_not_zero(tiny_gan):
    G, _ = tiny_gan
    G(torch.randn(2, 16)).sum().backward()
    release_grads(G)
    assert all(p.grad is None for p in G.parameters())


def test_adam_skips_parameters_whose_grad_is_none():
    a, b = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([a, b], lr=0.1)
    (a.sum() + b.sum()).backward()
    opt.step()  # both move and get momentum
    b_after_first = b.detach().clone()
    a.grad, b.grad = torch.ones(3), None
    opt.step()
    assert torch.equal(b, b_after_first)  # grad None: skipped entirely
    a.grad, b.grad = torch.ones(3), torch.zeros(3)
    opt.step()
    assert not torch.equal(b, b_after_first)  # a zero grad is not a skip: momentum still moves b


# 5. Sampling under eval() + no_grad() ---------------------------------------------------------


def test_sample_builds_no_graph_and_leaves_generator_untouched(tiny_gan):
    G, _ = tiny_gan
    G(torch.randn(32, 16))  # a train-mode forward, so BatchNorm's running stats are not the defaults
    params, buffers = snapshot(G), [b.clone() for b in G.buffers()]
    images = sample(G, torch.randn(8, 16))
    assert not images.requires_grad and images.grad_fn is None
    assert all(torch.equal(a, b) for a, b in zip(params, G.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(buffers, G.buffers()))  # running stats too
    assert G.training


def test_train_mode_sampling_would_move_batchnorm_stats(tiny_gan):
    G, _ = tiny_gan
    bn = next(m for m in G.modules() if isinstance(m, nn.BatchNorm2d))
    before = bn.running_mean.clone()
    with torch.no_grad():  # no_grad does not change BatchNorm's behaviour; only eval() does
        G(torch.randn(8, 16))
    assert not torch.equal(before, bn.running_mean)


def test_eval_mode_restores_the_previous_mode(tiny_gan):
    G, _ = tiny_gan
    G.eval()
    with eval_mode(G):
        pass
    assert not G.training
    G.train()
    with eval_mode(G):
        assert not G.training
    assert G.training


# 6. Device placement --------------------------------------------------------------------------


def test_device_mismatch_fails_with_a_message_naming_devices(tiny_gan):
    G, _ = tiny_gan
    G.to("meta")
    with pytest.raises(RuntimeError, match="meta|device"):
        G(torch.randn(2, 16))  # a CPU tensor into a module on another device


def test_unavailable_cuda_is_refused_naming_the_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="trainer.device='cuda'"):
        resolve_device("cuda")
    assert resolve_device("auto").type in ("cpu", "mps")


def test_checkpoint_tensors_follow_map_location(tmp_path, tiny_gan):
    G, D = tiny_gan
    save_checkpoint({"G": G.state_dict(), "D": D.state_dict(), "step": 1, "config": {}}, tmp_path / "c.pt")
    state = load_checkpoint(tmp_path / "c.pt", map_location="meta")
    assert all(t.device.type == "meta" for t in state["G"].values())


def test_numbers_leave_the_graph_detached_on_cpu_as_float32(tiny_gan):
    G, _ = tiny_gan
    images = G(torch.randn(2, 16))
    with pytest.raises(RuntimeError, match="requires grad"):
        images.numpy()  # a tensor in a graph cannot become numpy
    array = images.detach().cpu().numpy().astype("float32")
    assert array.dtype == "float32" and array.shape == (2, 1, 16, 16)


@pytest.mark.parametrize("loss, before", [("bce", "d/fake"), ("hinge", "d/fake_score")])
def test_g_step_logs_d_of_g_after_the_d_update(tiny_gan, loss, before):
    """pytorch/examples' D_G_z1 / D_G_z2: D(G(z)) in the D step (d/fake), and again in the G step,
    after D's update, on the same fakes (d/fake_after_d_step)."""
    G, D = tiny_gan
    ctx, after = StepContext(loss=LOSSES[loss]), f"{before}_after_d_step"
    opt_d, opt_g = torch.optim.Adam(D.parameters(), lr=1e-3), torch.optim.Adam(G.parameters(), lr=1e-3)
    real, fake = torch.rand(8, 1, 16, 16) * 2 - 1, G(torch.randn(8, 16))
    d_stats, features = d_step(D, opt_d, real, fake, ctx)
    with torch.no_grad():
        expected = LOSSES[loss].scores(D(fake), D(fake))[before]  # the updated D on the same fakes
    g_stats = g_step(D, G, opt_g, fake, features, ctx)
    torch.testing.assert_close(g_stats[after], expected)
    assert not torch.equal(g_stats[after], d_stats[before])  # D's update moved it
