"""The statements of docs/walkthrough.md and docs/more.md not proven in test_steps.py or test_claims.py, in order."""

import contextlib
import copy
import io
import warnings

import pytest
import torch
import torch.nn.functional as F
from test_claims import Branchy, gradient_of
from test_steps import BCE, adam, gradients_at_each_update
from torch.export import Dim, export
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.optim.swa_utils import update_bn

from gan.core import steps
from gan.core.ema import build_ema
from gan.core.losses import gradient_penalty
from gan.core.models import Discriminator
from gan.core.sampling import eval_mode, image_grid, sample
from gan.core.steps import FP32, d_step, frozen, g_step


def test_float_returns_the_same_tensor_when_it_is_float_already_and_indices_must_be_integers():
    images = torch.zeros(2, dtype=torch.uint8)
    assert images.float() is not images  # uint8 -> a new tensor: div_ on it is safe
    floats = torch.zeros(2)
    assert floats.float() is floats  # already float32: the very same tensor
    floats.float().div_(2.0).add_(1.0)
    assert floats.tolist() == [1.0, 1.0]  # an in-place op after .float() wrote into the original
    images = torch.arange(12, dtype=torch.uint8).view(3, 4)
    index = [2, 0]  # what BatchStream's sampler yields
    assert images[torch.tensor(index)].tolist() == [[8, 9, 10, 11], [0, 1, 2, 3]]  # int64 inferred
    with pytest.raises(IndexError, match="tensors used as indices must be long"):
        images[torch.Tensor(index)]  # float32: not an index


def test_G_takes_a_transposed_latent_batch_and_latents_made_on_its_device(tiny_gan):
    G, _ = tiny_gan
    G.eval()
    z = torch.randn(16, 4).t()  # (4, 16), not contiguous
    assert not z.is_contiguous()
    assert z.view(4, 16, 1, 1).data_ptr() == z.data_ptr()  # adding size-1 dims: always a view
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        z.view(64)  # merging dims across strides: not a view
    assert torch.equal(G(z), G(z.contiguous()))
    assert G.to("meta") is G  # Module.to moves the parameters in place
    z = torch.randn(2, 16, device="meta")  # created on the device, as gan/training/loop.py makes z
    assert G(z).shape == (2, 1, 16, 16) and G(z).device.type == "meta"
    with pytest.raises(RuntimeError, match="meta|device"):
        G(torch.randn(2, 16))  # a CPU tensor into a module on another device


def test_binary_cross_entropy_runs_under_cpu_autocast():
    probabilities = torch.sigmoid(torch.randn(4))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # on CUDA autocast refuses this op
        value = F.binary_cross_entropy(probabilities, torch.ones(4))
    assert value.dtype == torch.float32 and torch.isfinite(value)


def test_g_step_keeps_the_gradient_that_reaches_the_fake_images(tiny_gan):
    G, D = tiny_gan
    real, fake = torch.rand(8, 1, 16, 16), G(torch.randn(8, 16))
    _, real_features = d_step(D, adam(D), real, fake)
    stats = g_step(D, G, adam(G), fake, real_features)
    assert fake.grad is not None  # retain_grad() in g_step kept it on a non-leaf
    images = fake.detach().requires_grad_()  # D's weights are unchanged by the G step
    (expected,) = torch.autograd.grad(BCE.g(D(images)), images)
    torch.testing.assert_close(fake.grad, expected)
    # and the number logged for it is what its name says: the mean over the images of each one's gradient norm
    assert stats["grad_norm/images"].item() == pytest.approx(expected.flatten(1).norm(dim=1).mean().item(), rel=1e-5)
    # loss_G is a batch mean: the same images twice over (the same BatchNorm statistics) give half the norm
    z, norms = torch.randn(8, 16), []
    for copies in (1, 2):
        opt_g = torch.optim.SGD(G.parameters(), lr=0.0)  # lr 0: measure without changing G
        stats = g_step(D, G, opt_g, G(z.repeat(copies, 1)), torch.zeros(8 * copies, 1), FP32)
        norms.append(stats["grad_norm/images"])
    torch.testing.assert_close(norms[1], norms[0] / 2, rtol=1e-4, atol=0)


def test_frozen_spectrally_normalised_discriminator_still_advances_its_power_iteration():
    D = Discriminator(width=8, channels=1, image_size=16, batchnorm=False, spectral_norm=True)
    with torch.no_grad():  # as an update would: spectral norm's u, converged at init, now lags its weight
        for p in D.parameters():
            p.add_(torch.randn_like(p))
    u = [name for name, b in D.named_buffers() if name.endswith("_u") and b.numel() > 1]  # the head's u: 1 number
    before = {name: buffer.clone() for name, buffer in D.named_buffers() if name in u}
    with frozen(D):
        D(torch.randn(8, 1, 16, 16))
    assert u and all(not torch.equal(before[name], dict(D.named_buffers())[name]) for name in u)


@pytest.mark.parametrize("order", ["frozen", "unfrozen", "dcgan_main"])
def test_what_reaches_D_next_update_frozen_unfrozen_and_in_dcgan_main_order(tiny_gan, monkeypatch, order):
    """This loop's steps, with D frozen or not; and pytorch/examples' order: netD.zero_grad() first, D never frozen."""
    G, D = tiny_gan
    real, z = torch.rand(8, 1, 16, 16) * 2 - 1, torch.randn(8, 16)
    if order == "unfrozen":
        monkeypatch.setattr(steps, "frozen", contextlib.nullcontext)  # g_step's `with frozen(D)`, undone
    opt_g, opt_d = adam(G), adam(D)
    seen, own = gradients_at_each_update(opt_d), []
    for _ in range(2):
        fake = G(z)
        D_copy = copy.deepcopy(D)  # D's own gradient at this update, computed apart on a copy (no .grad copied)
        BCE.d(D_copy(real), D_copy(fake.detach())).backward()
        own.append(gradient_of(D_copy))
        if order != "dcgan_main":
            _, real_features = d_step(D, opt_d, real, fake)
            g_step(D, G, opt_g, fake, real_features)
            continue
        D.zero_grad()
        BCE.d(D(real), D(fake.detach())).backward()
        opt_d.step()
        G.zero_grad()
        BCE.g(D(fake)).backward()  # D not frozen: this fills D's .grad too
        assert all(p.grad is not None for p in D.parameters())
        opt_g.step()
    torch.testing.assert_close(seen[0], own[0])  # the first update: nothing written before it
    if order == "unfrozen":  # the first G step wrote into D's .grad, and nothing cleared it before D's next update
        assert float((seen[1] - own[1]).norm() / own[1].norm()) > 0.05
    else:  # frozen, nothing was written; in dcgan/main.py's order the next zero_grad() wiped it
        torch.testing.assert_close(seen[1], own[1])


@pytest.mark.parametrize("create_graph", [False, True])
def test_gradient_penalty_reaches_D_weights_only_with_create_graph(tiny_gan, monkeypatch, create_graph):
    """gan/core/losses.py:gradient_penalty, its torch.autograd.grad made with create_graph False or True."""
    G, D = tiny_gan
    real, fake = torch.rand(8, 1, 16, 16) * 2 - 1, G(torch.randn(8, 16)).detach()
    grad = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *args, **kw: grad(*args, **{**kw, "create_graph": create_graph}))
    penalty = gradient_penalty(D, real, fake)
    assert penalty.requires_grad == create_graph
    d_grads = []
    for loss in (BCE.d(D(real), D(fake)) + 10 * penalty, BCE.d(D(real), D(fake))):
        D.zero_grad(set_to_none=True)
        loss.backward()
        d_grads.append([p.grad.clone() for p in D.parameters()])
    # create_graph=False: the penalty is a constant to backward, so it silently changes nothing
    assert all(torch.allclose(a, b) for a, b in zip(*d_grads)) != create_graph


def test_step_diagnostics_are_detached_so_logging_them_warns_nothing(tiny_gan):
    G, D = tiny_gan
    real, fake = torch.rand(8, 1, 16, 16), G(torch.randn(8, 16))
    d_stats, real_features = d_step(D, adam(D), real, fake)
    stats = {**d_stats, **g_step(D, G, adam(G), fake, real_features)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a value that required grad would warn
        [float(value) for value in stats.values()]  # what Monitor.scalars does
    with pytest.warns(UserWarning, match="Converting a tensor with requires_grad=True to a scalar"):
        float(BCE.g(D(fake)))  # an undetached loss would warn on every log
    with pytest.raises(ValueError, match="only one element tensors can be converted"):
        float(real_features.mean(dim=0).flatten())  # a vector is not a number
    pytest.raises(RuntimeError, lambda: fake.numpy()).match("requires grad")  # a tensor in a graph cannot become numpy
    array = fake.detach().cpu().numpy()
    assert array.dtype == "float32" and array.shape == (8, 1, 16, 16)


def test_inference_mode_images_can_be_shown_but_not_trained_on(tiny_gan):
    G, D = tiny_gan
    with eval_mode(G), torch.inference_mode():
        images = G(torch.randn(4, 16))
    assert images.is_inference()
    assert image_grid(images).shape == (3, 38, 38)  # fine for a picture (make_grid makes RGB)
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        images.clamp_(-1, 1)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        d_step(D, adam(D), torch.rand(4, 1, 16, 16), images)
    assert not sample(G, torch.randn(4, 16)).is_inference()  # no_grad output: an ordinary tensor
    bn = G.net[1]
    for no_autograd in (torch.no_grad, torch.inference_mode):  # neither changes BatchNorm's behaviour; only eval() does
        before = bn.running_mean.clone()
        with no_autograd():  # G in train mode: sampling would move BatchNorm's running statistics
            G(torch.randn(4, 16))
        assert not torch.equal(before, bn.running_mean)


def test_the_ema_generators_averaged_statistics_do_not_match_its_averaged_weights(tiny_gan):
    """Against each layer's statistics of the very batch drawn (hence evaluate.py recomputes them)."""
    G, D = tiny_gan
    real = torch.rand(32, 1, 16, 16) * 2 - 1
    opt_g, opt_d = adam(G), adam(D)
    G_ema = build_ema(G, decay=0.99)
    for _ in range(20):
        fake = G(torch.randn(32, 16))
        _, real_features = d_step(D, opt_d, real, fake)
        g_step(D, G, opt_g, fake, real_features)
        G_ema.update_parameters(G)
    averaged, recomputed = G_ema.module, copy.deepcopy(G_ema.module)
    update_bn([torch.randn(256, 16) for _ in range(8)], recomputed)  # what evaluate.py does (bn_batches)
    z = torch.randn(256, 16)
    with torch.no_grad():
        own = copy.deepcopy(averaged).train()(z)  # each BatchNorm with this batch's own statistics
        error_averaged = (sample(averaged, z) - own).abs().mean()
        error_recomputed = (sample(recomputed, z) - own).abs().mean()
    assert error_averaged > 10 * error_recomputed


def test_a_numpy_view_and_a_state_dict_of_a_parameter_follow_its_updates_until_saved(tiny_gan):
    G, _ = tiny_gan
    weight, state = G.net[0].weight, G.state_dict()
    assert not state["net.0.weight"].requires_grad and state["net.0.weight"].data_ptr() == weight.data_ptr()
    shared = weight.detach().cpu().numpy()  # on the CPU: no copy anywhere in this chain
    snapshot, buffer = shared.copy(), io.BytesIO()
    torch.save(state, buffer)  # serialised now: the bytes are a copy
    G(torch.randn(4, 16)).sum().backward()
    adam(G).step()
    assert (shared == weight.detach().numpy()).all() and torch.equal(state["net.0.weight"], weight)  # both moved
    assert not (snapshot == shared).all()  # only the explicit copy kept the old values
    buffer.seek(0)
    assert not torch.equal(torch.load(buffer, weights_only=True)["net.0.weight"], weight)  # and the file


@pytest.mark.filterwarnings("ignore")  # torch.jit's deprecation and tracer notices
def test_trace_script_and_export_of_G_and_the_mode_each_keeps(tiny_gan):
    G, _ = tiny_gan
    z = torch.randn(4, 16)
    traced_in_train = torch.jit.trace(G, z, check_trace=False)
    G.eval()
    traced_in_eval = torch.jit.trace(G, z, check_trace=False)
    traced_in_train.eval()
    bn = G.net[1]  # a trace shares G's parameters and buffers
    with torch.no_grad():
        expected = G(z)
        assert torch.equal(traced_in_eval(z), expected)
        assert traced_in_eval(torch.randn(7, 16)).shape[0] == 7  # z.size(0) was traced as an op
        stats = bn.running_mean.clone()
        assert not torch.allclose(traced_in_train(z), expected)  # batch statistics, baked in
        assert not torch.equal(stats, bn.running_mean)  # and it still moves G's running statistics
    G.train()  # script keeps the mode switch
    with pytest.warns((FutureWarning, DeprecationWarning), match="deprecated"):  # torch 2.14's, torch 2.11's
        scripted = torch.jit.script(G)
    with torch.no_grad():
        assert torch.allclose(scripted(z), G(z))
        G.eval()
        scripted.eval()
        assert torch.allclose(scripted(z), G(z))
    program = export(G, (torch.randn(4, 16),), dynamic_shapes=({0: Dim("batch", min=2)},))
    z = torch.randn(5, 16)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(z), G(z))
    pytest.raises(GuardOnDataDependentSymNode, lambda: export(Branchy(), (torch.ones(2),)))
