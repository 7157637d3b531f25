"""Invariants tier: each technique of the training step, of sampling and of evaluation, on the real G and D.

Two kinds of test, in two sections:

- proofs of this project's code: each calls the project's own functions (`gan.core.steps.d_step`,
  `g_step`, `backward_terms`, `gan.core.sampling.sample`, `gan.training.train`,
  `gan.evaluation.pipeline.prepare_generator`, ...) and asserts what a technique guarantees there.
  tests/test_mutations.py removes each technique from a copy of gan/ and checks that the proofs it
  cites for it (its list MUTATIONS, tabled in docs/proofs.md) fail on that copy and pass on an
  unchanged one;
- PyTorch facts (not proofs of this project's code): toy code that shows what goes wrong without a
  technique in PyTorch itself. They never call the step they illustrate, so they pass whatever
  gan/ does: a page may cite them for the failure a technique prevents, never as the proof that
  this project applies it (tests/test_docs.py checks that for the README's technique table).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import pytest
import torch
from conftest import compose_config
from PIL import Image
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from gan.checkpoint import load_checkpoint, save_checkpoint
from gan.config import BackwardMode, ConfigError, EvaluateConfig, to_plain
from gan.core.ema import build_ema
from gan.core.losses import LOSSES
from gan.core.sampling import eval_mode, image_grid, sample
from gan.core.steps import StepContext, backward_terms, d_step, frozen, g_step, release_grads
from gan.device import resolve_device
from gan.evaluation.pipeline import build_generator, prepare_generator
from gan.training import train
from gan.training.state import build_models

BCE = LOSSES["bce"]


def adam(module: nn.Module) -> torch.optim.Adam:
    return torch.optim.Adam(module.parameters(), lr=1e-2, betas=(0.5, 0.999))


def snapshot(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def batch(G: nn.Module, n: int = 16) -> tuple[Tensor, Tensor]:
    real = torch.rand(n, 1, 16, 16) * 2 - 1
    fake = G(torch.randn(n, 16))
    return real, fake


# ==================================================================================================
# Proofs of this project's code: each test calls gan/ and fails when its technique is removed there
# (tests/test_mutations.py checks that for the tests it cites).
# ==================================================================================================

# 1. D step on fake.detach() ------------------------------------------------------------------


def test_d_step_leaves_generator_gradients_none(tiny_gan):
    G, D = tiny_gan
    real, fake = batch(G)
    d_before = snapshot(D)
    d_step(D, adam(D), real, fake)
    assert all(p.grad is None for p in G.parameters())
    assert all(p.grad is None for p in D.parameters())  # released after the update
    assert any(not torch.equal(a, b) for a, b in zip(d_before, D.parameters()))  # D did learn


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


def two_term_objective(G: nn.Module, D: nn.Module, real: Tensor) -> dict[str, Tensor]:
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


def iteration(
    G: nn.Module, D: nn.Module, opt_g: torch.optim.Optimizer, opt_d: torch.optim.Optimizer, z: Tensor, real: Tensor
) -> None:
    """One iteration of gan/training/loop.py:train's body: the fakes, the D step, the G step."""
    fake = G(z)
    _, real_features = d_step(D, opt_d, real, fake)
    g_step(D, G, opt_g, fake, real_features)


def test_each_update_sees_only_its_own_gradients(tiny_gan):
    """The loop clears gradients after each update (release_grads), never before a backward, so every
    isolation of the steps is visible in the next update: two iterations of the real steps, against
    copies whose .grad were cleared by hand before the second (what zero_grad() before each backward
    would give), must leave the same weights. Any gradient left over from the first iteration (D's or
    G's own, not released; or the G step's into D, not frozen) would be added to the second's."""
    G, D = tiny_gan
    opt_g, opt_d = adam(G), adam(D)
    gen = torch.Generator().manual_seed(1)
    first, second = (
        (torch.randn(16, 16, generator=gen), torch.rand(16, 1, 16, 16, generator=gen) * 2 - 1) for _ in "12"
    )
    iteration(G, D, opt_g, opt_d, *first)
    fresh = copy.deepcopy((G, D, opt_g, opt_d))  # one deepcopy: each optimizer holds its copy's parameters
    assert fresh[2].param_groups[0]["params"][0] is next(fresh[0].parameters())
    for p in [*fresh[0].parameters(), *fresh[1].parameters()]:
        p.grad = None
    iteration(G, D, opt_g, opt_d, *second)
    iteration(*fresh, *second)
    for net, clean, name in ((D, fresh[1], "D"), (G, fresh[0], "G")):
        for (key, p), q in zip(net.named_parameters(), clean.parameters()):
            assert torch.equal(p, q), f"{name}.{key}: the second update saw a gradient of the first iteration"
            assert p.grad is None  # and every gradient is released after its update


# 5. Sampling under eval() + no_grad(), from the EMA generator --------------------------------


def test_sample_builds_no_graph_and_leaves_generator_untouched(tiny_gan):
    G, _ = tiny_gan
    G(torch.randn(32, 16))  # a train-mode forward, so BatchNorm's running stats are not the defaults
    params, buffers = snapshot(G), [b.clone() for b in G.buffers()]
    images = sample(G, torch.randn(8, 16))
    assert not images.requires_grad and images.grad_fn is None
    assert all(torch.equal(a, b) for a, b in zip(params, G.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(buffers, G.buffers()))  # running stats too
    assert G.training


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


def png_pixels(grid: Tensor) -> Tensor:
    """A float (3, H, W) grid in [0, 1] as torchvision's save_image writes it: uint8 (H, W, 3), here int16."""
    return grid.mul(255).add_(0.5).clamp_(0, 255).permute(1, 2, 0).to(torch.uint8).to(torch.int16)


# A half-life of 10,000 images and no ramp-up keep the EMA near G's weights of step 1, while a large
# learning rate moves G far from them in two more steps: the two generators draw visibly different grids.
EMA_APART = ("model.ema_kimg=10", "model.ema_rampup=0", "optim.lr=0.05")


def test_sample_grids_are_drawn_from_the_ema_generator(tmp_path, one_thread):
    cfg = compose_config(*EMA_APART, "trainer.max_steps=3", "trainer.sample_every=3")
    train(cfg, tmp_path)
    state = load_checkpoint(tmp_path / "checkpoints" / "last.pt")  # written at step 3, after the grid
    written = torch.from_numpy(np.array(Image.open(tmp_path / "samples" / "step_000003.png").convert("RGB")))
    drawn = {}
    for use_ema in (True, False):
        G, name = build_generator(state, use_ema, torch.device("cpu"))
        drawn[name] = png_pixels(image_grid(sample(G, state["fixed_z"])))
    # the EMA's grid, up to a rounding of one level where thread counts order a sum differently
    assert (written.to(torch.int16) - drawn["EMA"]).abs().max() <= 1
    assert (written.to(torch.int16) - drawn["raw"]).abs().max() > 1  # and not G's own


# 6. Device placement --------------------------------------------------------------------------


class RandnCalls(TorchFunctionMode):
    """Records (shape, the device= argument or None) of each torch.randn call made while active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[tuple[int, ...], object]] = []

    def __torch_function__(
        self, func: Callable[..., Any], types: tuple[type, ...], args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.randn:
            shape = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
            self.calls.append((tuple(int(n) for n in shape), kwargs.get("device")))
        return func(*args, **kwargs)


def test_the_loop_makes_each_latent_batch_on_the_device(tmp_path, one_thread):
    # On a CPU run a latent made on the CPU and moved is on the right device too, so the test looks at
    # how it is made: torch.randn must be given the training device (nothing made elsewhere, then copied).
    cfg = compose_config("trainer.max_steps=2")
    with RandnCalls() as randn:
        train(cfg, tmp_path)
    latents = [device for shape, device in randn.calls if shape == (cfg.data.batch_size, cfg.model.z_dim)]
    assert len(latents) == cfg.trainer.max_steps  # one latent batch per step
    expected = resolve_device(cfg.trainer.device).type
    assert all(device is not None and torch.device(device).type == expected for device in latents), latents


def test_unavailable_cuda_is_refused_naming_the_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="trainer.device='cuda'"):
        resolve_device("cuda")
    assert resolve_device("auto").type in ("cpu", "mps")


def test_checkpoint_tensors_follow_map_location(tmp_path, tiny_gan):
    G, D = tiny_gan
    save_checkpoint(
        {"G": G.state_dict(), "D": D.state_dict(), "step": 1, "num_classes": 0, "config": {}}, tmp_path / "c.pt"
    )
    state = load_checkpoint(tmp_path / "c.pt", map_location="meta")
    assert all(t.device.type == "meta" for t in state["G"].values())


# 7. Evaluation: BatchNorm statistics recomputed for the measured generator --------------------


def test_evaluation_recomputes_the_batchnorm_statistics_of_the_generator_it_measures(one_thread):
    cfg, cpu = compose_config(), torch.device("cpu")
    G, _ = build_models(cfg, cpu)
    G_ema = build_ema(G, cfg.model.ema_decay)
    G_ema.update_parameters(G)
    for bn in (m for m in G_ema.modules() if isinstance(m, nn.BatchNorm2d)):
        bn.running_mean.fill_(3.0)  # statistics that do not belong to these weights, as an
        bn.running_var.fill_(50.0)  # EMA's average of past statistics does not
    state = {"config": to_plain(cfg), "G": G.state_dict(), "G_ema": G_ema.state_dict(), "step": 1, "num_classes": 0}
    measured, about = prepare_generator(state, EvaluateConfig(checkpoint="run", bn_batches=10, batch_size=200), cpu)
    stale, _ = build_generator(state, use_ema=True, device=cpu)  # the checkpoint's statistics
    z = torch.randn(2000, cfg.model.z_dim, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        own = copy.deepcopy(measured).train()(z)  # each BatchNorm with these 2000 latents' own statistics
        stale_error = (stale(z) - own).abs().mean()
        error = (measured(z) - own).abs().mean()
    assert stale_error > 0.01  # the checkpoint's statistics change the images
    assert error < stale_error / 10, (error, stale_error)  # recomputed from 2000 other latents
    assert not measured.training and about["batchnorm_stats"].startswith("recomputed")


# 8. Logging D(G(z)) before and after D's update ------------------------------------------------


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


# ==================================================================================================
# PyTorch facts (not proofs of this project's code). Toy code showing what goes wrong without a
# technique, in PyTorch itself: none of these calls the step it illustrates, so they pass whatever
# gan/ does. The docs cite them as the failure a technique prevents, never as the proof that this
# project applies it (tests/test_docs.py checks README's technique table for that).
# ==================================================================================================


def test_without_detach_d_loss_reaches_generator(tiny_gan):
    G, D = tiny_gan
    real, fake = batch(G)
    BCE.d(D(real), D(fake)).backward()  # what d_step would do without .detach()
    assert all(p.grad is not None for p in G.parameters())


def test_without_freezing_g_loss_fills_discriminator_grads(tiny_gan):
    G, D = tiny_gan
    _, fake = batch(G)
    BCE.g(D(fake)).backward()  # the canonical example's G step (pytorch/examples#361)
    assert all(p.grad is not None for p in D.parameters())


def test_second_backward_without_retain_graph_raises(tiny_gan):
    G, D = tiny_gan
    terms = two_term_objective(G, D, torch.rand(16, 1, 16, 16))
    terms["adv"].backward()  # frees the saved tensors of the graph shared with "fm"
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        terms["fm"].backward()


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


def test_train_mode_sampling_would_move_batchnorm_stats(tiny_gan):
    G, _ = tiny_gan
    bn = next(m for m in G.modules() if isinstance(m, nn.BatchNorm2d))
    before = bn.running_mean.clone()
    with torch.no_grad():  # no_grad does not change BatchNorm's behaviour; only eval() does
        G(torch.randn(8, 16))
    assert not torch.equal(before, bn.running_mean)


def test_device_mismatch_fails_with_a_message_naming_devices(tiny_gan):
    G, _ = tiny_gan
    G.to("meta")
    with pytest.raises(RuntimeError, match="meta|device"):
        G(torch.randn(2, 16))  # a CPU tensor into a module on another device


def test_numbers_leave_the_graph_detached_on_cpu_as_float32(tiny_gan):
    G, _ = tiny_gan
    images = G(torch.randn(2, 16))
    with pytest.raises(RuntimeError, match="requires grad"):
        images.numpy()  # a tensor in a graph cannot become numpy
    array = images.detach().cpu().numpy().astype("float32")
    assert array.dtype == "float32" and array.shape == (2, 1, 16, 16)
