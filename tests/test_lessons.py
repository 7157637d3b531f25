"""The lessons of docs/more.md (and retain_graph's cost), on the real G and D with the counterfactual that makes
each matter; docs/tour.ipynb runs them at a larger size."""

import weakref

import pytest
import torch
from test_steps import BCE, adam
from torch import nn

from gan.core.losses import d_loss_bce
from gan.core.models import Discriminator
from gan.core.steps import BackwardMode, StepContext, d_step, g_step, release_grads
from gan.data import render_digits, to_unit_range


def digits(n: int = 32, seed: int = 0) -> torch.Tensor:
    """n built-in digits at 16 px in [-1, 1], the tiny_gan fixture's size."""
    return to_unit_range(render_digits(n, 16, seed=seed)[0])


def counts(module: nn.Module) -> set[int]:
    """The forwards each BatchNorm of the module counted in train mode."""
    return {int(m.num_batches_tracked) for m in module.modules() if isinstance(m, nn.BatchNorm2d)}


def test_real_and_fake_go_through_D_as_separate_batches_because_batchnorm_mixes_a_batch(tiny_gan):
    G, D = tiny_gan
    real, fake = digits(16), G(torch.randn(16, 16)).detach()
    with torch.no_grad():
        alone_real, alone_fake = D(real), D(fake)  # what d_step and g_step each give D
        mixed = D(torch.cat([real, fake]))  # one mixed batch: BatchNorm normalises over both
    assert not torch.allclose(mixed[:16], alone_real, atol=1e-3)
    # the G step sees an all-fake batch: a mixed D step would have judged the fakes differently
    assert not torch.allclose(mixed[16:], alone_fake, atol=1e-3)
    D.eval()  # running statistics: each sample on its own, whatever its batch-mates
    with torch.no_grad():
        torch.testing.assert_close(D(torch.cat([real, fake]))[:16], D(real))
    # without BatchNorm a mixed batch gives D the same logits
    torch.manual_seed(0)
    D = Discriminator(width=8, channels=1, image_size=16, batchnorm=False)
    real, fake = digits(16), torch.rand(16, 1, 16, 16) * 2 - 1
    with torch.no_grad():
        torch.testing.assert_close(D(torch.cat([real, fake])), torch.cat([D(real), D(fake)]))


def test_D_running_statistics_update_twice_in_d_step_and_once_in_g_step_and_G_once(tiny_gan):
    G, D = tiny_gan
    assert counts(D) == counts(G) == {0}  # both have BatchNorm
    fake = G(torch.randn(16, 16))  # the loop's one G forward per iteration
    assert counts(G) == {1}
    _, real_features = d_step(D, adam(D), digits(16), fake)
    assert counts(D) == {2}  # D(real), then D(fake.detach()): two forwards in train mode
    g_step(D, G, adam(G), fake, real_features)
    assert counts(D) == {3}  # D(fake) once more; frozen D still updates its statistics
    assert counts(G) == {1}  # neither step runs G forward again


@pytest.mark.parametrize("mode", list(BackwardMode))
def test_separate_mode_runs_G_backward_once_per_term(tiny_gan, mode):
    G, D = tiny_gan
    calls = []
    G.net[0].weight.register_hook(lambda grad: calls.append(1))  # one call per backward through G
    real, fake = digits(16), G(torch.randn(16, 16))
    _, real_features = d_step(D, adam(D), real, fake)
    g_step(D, G, adam(G), fake, real_features, StepContext(feature_matching=1.0, backward_mode=mode))
    assert len(calls) == (2 if mode == BackwardMode.separate else 1)


def test_retain_graph_keeps_the_saved_tensors_until_the_last_backward(tiny_gan):
    G, D = tiny_gan
    fake = G(torch.randn(8, 16))
    loss = BCE.g(D(fake))
    loss.backward(retain_graph=True)
    assert fake.grad_fn._saved_result is not None  # tanh's output, still held by the graph
    loss.backward()  # the last backward frees them
    with pytest.raises(RuntimeError, match="already been freed"):
        _ = fake.grad_fn._saved_result


@pytest.mark.parametrize("batchnorm", [False, True])
def test_accumulated_micro_batches_equal_the_big_batch_only_when_D_has_no_batchnorm(batchnorm):
    torch.manual_seed(0)
    D = Discriminator(width=8, channels=1, image_size=16, batchnorm=batchnorm)
    real, fake = digits(32), torch.rand(32, 1, 16, 16) * 2 - 1
    grads = []
    for k in (1, 4):  # D's gradient of d_loss_bce accumulated over k backward calls of loss / k, then released
        for r, f in zip(real.chunk(k), fake.chunk(k)):
            (d_loss_bce(D(r), D(f)) / k).backward()  # adds into .grad; no retain_graph
        grads.append([p.grad.clone() for p in D.parameters()])
        release_grads(D)  # only after the (here absent) optimizer step
    big, accumulated = grads
    differences = [float((a - b).norm() / a.norm()) for a, b in zip(big, accumulated)]
    if batchnorm:
        assert max(differences) > 0.01  # statistics of 8 images are not those of 32
    else:
        for a, b in zip(big, accumulated):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_backward_adds_into_grad_until_released_and_two_calls_before_the_step_are_accumulation(tiny_gan):
    """Then the canonical loop's errD_real.backward(); errD_fake.backward(); optimizer.step()."""
    G, D = tiny_gan
    D.eval()  # the same statistics in every pass, so only the order of additions differs
    real, fake = digits(16), G(torch.randn(16, 16)).detach()
    d_loss_bce(D(real), D(fake)).backward()
    together = [p.grad.clone() for p in D.parameters()]
    d_loss_bce(D(real), D(fake)).backward()  # a second backward without releasing: added
    for a, p in zip(together, D.parameters()):
        torch.testing.assert_close(p.grad, 2 * a)
    released = [weakref.ref(p.grad) for p in D.parameters()]
    release_grads(D)
    assert all(ref() is None for ref in released)  # the gradient memory is freed, not zeroed
    ones, zeros = torch.ones(16), torch.zeros(16)
    nn.functional.binary_cross_entropy_with_logits(D(real), ones).backward()  # errD_real
    nn.functional.binary_cross_entropy_with_logits(D(fake), zeros).backward()  # errD_fake
    for a, p in zip(together, D.parameters()):
        torch.testing.assert_close(p.grad, a)


def test_channels_last_features_of_the_real_D_need_flatten_not_view(tiny_gan):
    _, D = tiny_gan
    D = D.to(memory_format=torch.channels_last)  # as gan/training/state.py:build_models does by default
    _, features = D(digits(4).contiguous(memory_format=torch.channels_last), with_features=True)
    assert features.is_contiguous(memory_format=torch.channels_last) and not features.is_contiguous()
    pytest.raises(RuntimeError, lambda: features.view(4, -1)).match("view size is not compatible")
    nchw = features.detach().clone(memory_format=torch.contiguous_format).view(4, -1)
    for flat in (features.flatten(1), features.reshape(4, -1), features.contiguous().view(4, -1)):
        assert flat.data_ptr() != features.data_ptr()  # a copy in NCHW order: what gradient_penalty and r1 use
        torch.testing.assert_close(flat, nchw)


def test_a_discriminator_that_wins_sends_D_of_G_to_0_and_loss_g_up(tiny_gan):
    """D(x) -> 1, D(G(z)) -> 0, loss_G climbing: here made by a G that does not learn."""
    G, D = tiny_gan
    opt_d, real, z = adam(D, lr=2e-3), digits(64), torch.randn(64, 16)
    history = []
    for step in range(30):
        fake = G(z[step % 4 * 16 :][:16])
        stats, real_features = d_step(D, opt_d, real[step % 4 * 16 :][:16], fake)
        with torch.no_grad():
            loss_g = BCE.g(D(fake))  # what g_step would report; G is never updated
        history.append((float(stats["d/real"]), float(stats["d/fake"]), float(loss_g)))
    first, last = history[0], history[-1]
    assert last[0] > 0.9 and last[1] < 0.1  # D tells them apart
    assert last[2] > first[2] + 1.0  # and G's loss climbs: -log D(G(z)) grows as D(G(z)) -> 0


def test_non_saturating_loss_keeps_the_gradient_that_the_minimax_loss_loses():
    logit = torch.tensor([-8.0], requires_grad=True)  # D(G(z)) = sigmoid(-8) = 0.0003: D wins
    (minimax,) = torch.autograd.grad(-d_loss_bce(torch.zeros(1), logit), logit)  # G minimises log(1 - D(G(z)))
    (non_saturating,) = torch.autograd.grad(BCE.g(logit), logit)  # G minimises -log D(G(z))
    assert minimax.abs() < 1e-3 and non_saturating.abs() > 0.99
