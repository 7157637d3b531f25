"""gan/core/steps.py and the techniques around it, on the real G and D: proofs of this project's code (which
tests/test_mutations.py mutates), then PyTorch facts, which a page may cite for a failure but never as a proof."""

import contextlib
import copy
import gc
import weakref
from typing import Any, Callable, Iterator

import pytest
import torch
from conftest import compose_config
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from gan.checkpoint import load_checkpoint, save_checkpoint
from gan.config import BackwardMode, ConfigError, EvaluateConfig, Precision, to_plain
from gan.core.ema import build_ema
from gan.core.losses import LOSSES, feature_matching
from gan.core.sampling import eval_mode, sample
from gan.core.steps import Penalties, StepContext, backward_terms, d_step, frozen, g_step
from gan.device import resolve_device
from gan.evaluation.pipeline import build_generator, prepare_generator
from gan.training import train
from gan.training.state import build_models, build_optimizer, step_context
from scripts.bench import SigmoidD, canonical_step

BCE, CPU = LOSSES["bce"], torch.device("cpu")


def adam(module: nn.Module, lr: float = 1e-2) -> torch.optim.Adam:
    return torch.optim.Adam(module.parameters(), lr=lr, betas=(0.5, 0.999))


def batch(G: nn.Module, n: int = 16) -> tuple[Tensor, Tensor]:
    return torch.rand(n, 1, 16, 16) * 2 - 1, G(torch.randn(n, 16))


def gradients_at_each_update(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every .grad the optimizer uses, flattened into one vector per update."""
    seen: list[torch.Tensor] = []

    def keep(opt, args, kwargs):
        grads = [p.grad.flatten() for group in opt.param_groups for p in group["params"] if p.grad is not None]
        seen.append(torch.cat(grads).clone())

    optimizer.register_step_pre_hook(keep)
    return seen


@contextlib.contextmanager
def gradient_arrivals(module: nn.Module) -> Iterator[list[str]]:
    """Names of the parameters whose gradient autograd computes inside the block (even if cleared before its end)."""
    arrived: list[str] = []
    hooks = [p.register_hook(lambda _, name=name: arrived.append(name)) for name, p in module.named_parameters()]
    yield arrived
    for hook in hooks:
        hook.remove()


@contextlib.contextmanager
def saved_tensors() -> Iterator[list[weakref.ref]]:
    """A weak reference to a holder (a closure) of each tensor saved for backward in the block: dead, after
    gc.collect(), once backward released it."""
    refs: list[weakref.ref] = []

    def pack(tensor: Tensor) -> Callable[[], Tensor]:
        refs.append(weakref.ref(holder := lambda: tensor))
        return holder

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda holder: holder()):
        yield refs


class Tagged(torch.autograd.Function):
    """The identity, whose backward node holds `token`: the token lives as long as the graph on its output."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, token: object) -> Tensor:
        ctx.token = token
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def test_d_step_leaves_generator_gradients_none(tiny_gan):
    """For each loss and penalty: D's update sees its loss's gradient (both terms), G gets none, no .grad stays."""
    G, D = tiny_gan
    for name, loss in LOSSES.items():
        real, fake = batch(G)
        reference = copy.deepcopy(D)  # D before its update, in the same (train) mode
        opt = torch.optim.SGD(D.parameters(), lr=0.01)
        seen = gradients_at_each_update(opt)  # release_grads clears .grad after the step
        with gradient_arrivals(G) as into_g:
            d_step(D, opt, real, fake, StepContext(loss=loss))
        assert not into_g, f"{name}: the D step computed a gradient for G's {into_g}"
        assert all(p.grad is None for p in [*G.parameters(), *D.parameters()]), f"{name}: a .grad outlived the step"
        # d_step's forward passes, in its order (BatchNorm normalises each batch on its own)
        real_logits, fake_logits = reference(real), reference(fake.detach())
        by_real, by_fake = torch.autograd.grad(
            loss.d(real_logits, fake_logits), (real_logits, fake_logits), allow_unused=True, materialize_grads=True
        )
        params = list(reference.parameters())
        from_real = torch.autograd.grad(real_logits, params, by_real)
        from_fake = torch.autograd.grad(fake_logits, params, by_fake)
        assert nn.utils.get_total_norm(from_real) > 0, f"{name}: the D loss does not depend on the real logits"
        assert nn.utils.get_total_norm(from_fake) > 0, f"{name}: the D loss does not depend on the fake logits"
        expected = torch.cat([(r + f).flatten() for r, f in zip(from_real, from_fake)])  # every parameter's
        torch.testing.assert_close(seen[0], expected, rtol=1e-4, atol=1e-6, msg=f"{name}: not the real + fake terms")
    for penalties in (Penalties(gradient_penalty=10.0), Penalties(r1=1.0)):
        for name, loss in LOSSES.items():
            real, fake = batch(G)
            with gradient_arrivals(G) as into_g:
                stats, _ = d_step(D, adam(D), real, fake, StepContext(loss=loss, penalties=penalties))
            assert {"loss/d_gp", "loss/d_r1"} & set(stats), "the penalty was not on"
            assert not into_g, f"{name}, {penalties}: the D step computed a gradient for G's {into_g}"


def test_g_step_leaves_discriminator_untouched(tiny_gan):
    """G's update sees exactly the G loss's gradient through D; D gets no gradient, its weights and flags unchanged."""
    G, D = tiny_gan
    z, real = torch.randn(16, 16), torch.rand(16, 1, 16, 16) * 2 - 1
    G_before, fake = copy.deepcopy(G), G(z)
    _, real_features = d_step(D, adam(D), real, fake)
    D_after, d_weights = copy.deepcopy(D), [p.detach().clone() for p in D.parameters()]
    opt = torch.optim.SGD(G.parameters(), lr=0.01)
    seen = gradients_at_each_update(opt)
    with gradient_arrivals(D) as into_d:
        g_step(D, G, opt, fake, real_features)
    assert not into_d, f"the G step computed a gradient for D's {into_d}"
    assert all(torch.equal(a, b) for a, b in zip(d_weights, D.parameters()))
    assert all(p.requires_grad for p in D.parameters())  # unfrozen after
    assert all(p.grad is None for p in [*G.parameters(), *D.parameters()])  # released after the update
    params = list(G_before.parameters())
    expected = torch.autograd.grad(BCE.g(D_after(G_before(z))), params)
    assert nn.utils.get_total_norm(expected) > 0
    expected = torch.cat([e.flatten() for e in expected])  # every parameter's, so none may lack a gradient
    torch.testing.assert_close(seen[0], expected, rtol=1e-4, atol=1e-6, msg="not the G loss's gradient through D")


def test_frozen_restores_each_flag_even_on_error(tiny_gan):
    _, D = tiny_gan
    head = D.head.weight
    head.requires_grad_(False)  # a parameter frozen on purpose stays frozen
    with pytest.raises(RuntimeError, match="boom"), frozen(D):
        assert not any(p.requires_grad for p in D.parameters())
        raise RuntimeError("boom")
    assert not head.requires_grad and all(p.requires_grad for p in D.features.parameters())


def test_summed_and_separate_backward_give_the_same_gradients(tiny_gan):
    G, D = tiny_gan
    real, grads = torch.rand(16, 1, 16, 16) * 2 - 1, {}
    for mode in BackwardMode:
        G_copy = copy.deepcopy(G)
        torch.manual_seed(1)
        with frozen(D):
            logits, features = D(G_copy(torch.randn(16, 16)), with_features=True)
            _, real_features = D(real, with_features=True)
        terms = {"adv": BCE.g(logits), "fm": 10 * feature_matching(real_features.detach(), features)}
        norms = backward_terms(terms, list(G_copy.parameters()), mode)
        grads[mode] = [p.grad.clone() for p in G_copy.parameters()]
        assert set(norms) == (set() if mode == BackwardMode.summed else {"adv", "fm"})
    for a, b in zip(grads[BackwardMode.summed], grads[BackwardMode.separate]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_g_step_logs_each_term_in_separate_mode(tiny_gan):
    """loss/g is the sum of the logged terms; grad_norm/g_NAME is the norm of term NAME's own gradient."""
    G, D = tiny_gan
    z, real = torch.randn(16, 16), torch.rand(16, 1, 16, 16) * 2 - 1
    fake = G(z)
    _, real_features = d_step(D, adam(D), real, fake)
    G_copy, D_copy = copy.deepcopy(G), copy.deepcopy(D)
    ctx = StepContext(feature_matching=1.0, backward_mode=BackwardMode.separate)
    stats = g_step(D, G, adam(G), fake, real_features, ctx)
    assert stats["loss/g"].item() == pytest.approx((stats["loss/g_adv"] + stats["loss/g_fm"]).item())
    logits, features = D_copy(G_copy(z), with_features=True)
    terms = {"adv": BCE.g(logits), "fm": feature_matching(real_features, features)}
    for name, term in terms.items():
        own = torch.autograd.grad(term, list(G_copy.parameters()), retain_graph=True)
        assert stats[f"grad_norm/g_{name}"].item() == pytest.approx(nn.utils.get_total_norm(own).item(), rel=1e-4), name


def test_g_step_frees_the_graph_of_g_when_it_returns(tiny_gan):
    """In both modes every saved tensor is freed on return though the caller holds `fake`; nothing keeps the graph."""
    G, D = tiny_gan
    for mode in BackwardMode:
        ctx = StepContext(feature_matching=1.0, backward_mode=mode)  # two G terms: separate runs two backwards
        token = lambda: None  # noqa: E731 (an object only Tagged's node holds)
        node_alive = weakref.ref(token)
        with saved_tensors() as saved:
            fake = Tagged.apply(G(torch.randn(16, 16)), token)
            _, real_features = d_step(D, adam(D), torch.rand(16, 1, 16, 16) * 2 - 1, fake, ctx)
            stats = g_step(D, G, adam(G), fake, real_features, ctx)
        del token
        gc.collect()
        kept = sum(ref() is not None for ref in saved)
        assert saved and not kept, f"{mode.value}: {kept} of {len(saved)} saved tensors outlive the G step"
        pytest.raises(RuntimeError, fake.sum().backward).match("backward through the graph a second time")
        assert not [tag for tag, value in stats.items() if value.requires_grad], f"{mode.value}: stats with a graph"
        del fake, stats
        gc.collect()
        assert node_alive() is None, f"{mode.value}: something the G step left behind holds G's graph"


def iteration(G, D, opt_g, opt_d, z: Tensor, real: Tensor) -> None:
    """One iteration of gan/training/loop.py:train's body: the fakes, the D step, the G step."""
    fake = G(z)
    _, real_features = d_step(D, opt_d, real, fake)
    g_step(D, G, opt_g, fake, real_features)


def test_each_update_sees_only_its_own_gradients(tiny_gan):
    """Two iterations leave the weights that clearing every .grad by hand between them would."""
    G, D = tiny_gan
    opt_g, opt_d = adam(G), adam(D)
    first, second = ((torch.randn(16, 16), torch.rand(16, 1, 16, 16) * 2 - 1) for _ in "12")
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


def test_sample_builds_no_graph_and_leaves_generator_untouched(tiny_gan):
    """From either mode: no tensor saved, no graph, G's state and mode unchanged, each image from its own latent."""
    G, _ = tiny_gan
    G(torch.randn(32, 16))  # a train-mode forward, so BatchNorm's running stats are not the defaults
    z = torch.randn(8, 16)
    for training in (True, False):
        G.train(training)
        state = copy.deepcopy(G.state_dict())
        with saved_tensors() as saved:
            images = sample(G, z)
        assert not saved, f"sampling saved {len(saved)} tensors for a backward"
        assert not images.requires_grad and images.grad_fn is None
        assert all(torch.equal(v, G.state_dict()[k]) for k, v in state.items())  # weights and running stats
        torch.testing.assert_close(sample(G, z[:3]), images[:3])
        with eval_mode(G):  # sample's eval_mode, which metrics.py uses too: eval inside, the mode as it was after
            assert not G.training
        assert G.training == training


class RandnCalls(TorchFunctionMode):
    """The device= of each torch.randn call that makes a `watched`-shaped tensor, and any move or copy of one."""

    def __init__(self, watched: tuple[int, ...]) -> None:
        super().__init__()
        self.watched, self.made, self.devices, self.moved = watched, [], [], []

    def __torch_function__(self, func: Callable[..., Any], types, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs, name = kwargs or {}, getattr(func, "__name__", "")
        if name in {"to", "cuda", "cpu", "copy_", "pin_memory"} and any(a is made for a in args for made in self.made):
            self.moved.append(name)
        result = func(*args, **kwargs)
        if func is torch.randn and tuple(result.shape) == self.watched:
            self.made.append(result)
            self.devices.append(kwargs.get("device"))
        return result


def test_the_loop_makes_each_latent_batch_on_the_device(tmp_path, one_thread):
    """torch.randn is given the device; the latent is never moved (a no-op .to() would copy on a GPU)."""
    cfg = compose_config("trainer.max_steps=2")
    shape = (cfg.data.batch_size, cfg.model.z_dim)
    with RandnCalls(watched=shape) as randn:
        train(cfg, tmp_path)
    assert len(randn.devices) == cfg.trainer.max_steps  # one latent batch per step
    expected = resolve_device(cfg.trainer.device).type
    assert all(device is not None and torch.device(device).type == expected for device in randn.devices), randn.devices
    assert not randn.moved, f"a latent batch was moved or copied after it was made: {randn.moved}"


def test_unavailable_cuda_is_refused_naming_the_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    pytest.raises(ConfigError, lambda: resolve_device("cuda")).match("trainer.device='cuda'")
    assert resolve_device("auto").type in ("cpu", "mps")


def test_checkpoint_tensors_follow_map_location(tmp_path, tiny_gan, monkeypatch):
    """From checkpoints saved on the CPU and tagged cuda:0 (as a GPU's), tensors land at map_location."""
    G, D = tiny_gan
    state = {"G": G.state_dict(), "D": D.state_dict(), "step": 1, "num_classes": 0, "config": {}}
    save_checkpoint(state, tmp_path / "cpu.pt")
    with monkeypatch.context() as patched:
        patched.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        save_checkpoint(state, tmp_path / "gpu.pt")
    tags: set[str] = set()
    torch.load(tmp_path / "gpu.pt", map_location=lambda storage, tag: tags.add(tag) or storage, weights_only=True)
    assert tags == {"cuda:0"}
    # as on a machine without a GPU, also where there is one: a load that restored onto cuda:0 first would fail
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for file, device in (("cpu.pt", "meta"), ("gpu.pt", "cpu"), ("gpu.pt", "meta")):
        loaded = load_checkpoint(tmp_path / file, map_location=device)
        assert all(t.device.type == device for t in loaded["G"].values()), (file, device)


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
        stale_error, error = (stale(z) - own).abs().mean(), (measured(z) - own).abs().mean()
    assert stale_error > 0.01  # the checkpoint's statistics change the images
    assert error < stale_error / 10, (error, stale_error)  # recomputed from 2000 other latents
    assert not measured.training and about["batchnorm_stats"].startswith("recomputed")


@pytest.mark.parametrize("loss, before", [("bce", "d/fake"), ("hinge", "d/fake_score")])
def test_g_step_logs_d_of_g_after_the_d_update(tiny_gan, loss, before):
    """pytorch/examples' D_G_z1 / D_G_z2: d/fake, and d/fake_after_d_step on the same fakes after D's update."""
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


DCGAN_D = ["model.d_batchnorm=true", "model.spectral_norm=false", "optim.beta1=0.5"]


@pytest.mark.parametrize("d", [[], DCGAN_D], ids=["default D", "DCGAN's D"])
def test_fp32_project_step_matches_the_canonical_step(d):
    """Fused Adam, with-logits losses, set_to_none and channels_last change no math (2 steps)."""
    cfg = compose_config("trainer.channels_last=true", *d)
    torch.manual_seed(0)
    G, D = build_models(cfg, CPU)
    netG, netD = copy.deepcopy(G).to(memory_format=torch.contiguous_format), copy.deepcopy(D)
    netD = SigmoidD(netD.to(memory_format=torch.contiguous_format))
    opt_g, opt_d = build_optimizer(G, cfg, CPU), build_optimizer(D, cfg, CPU)
    betas = (cfg.optim.beta1, cfg.optim.beta2)
    canon_g, canon_d = (torch.optim.Adam(net.parameters(), lr=cfg.optim.lr, betas=betas) for net in (netG, netD))
    ctx = step_context(Precision.fp32, CPU, skip_nonfinite=False)
    for _ in range(2):
        real, z = torch.rand(32, 1, 16, 16) * 2 - 1, torch.randn(32, cfg.model.z_dim)
        fake = G(z)
        d_stats, features = d_step(D, opt_d, real, fake, ctx)
        g_stats = g_step(D, G, opt_g, fake, features, ctx)
        canon_loss_d, canon_loss_g = canonical_step(netG, netD, canon_g, canon_d, real, z)
        assert d_stats["loss/d"].item() == pytest.approx(canon_loss_d, rel=1e-5, abs=1e-6)
        assert g_stats["loss/g"].item() == pytest.approx(canon_loss_g, rel=1e-5, abs=1e-6)
    # Adam divides by sqrt(v): a gradient's last-bit differences (another reduction order: one thread or
    # two, fused or not) can move a weight by ~1e-6 after two steps; a change of math moves it by ~lr
    for ours, theirs in ((G, netG), (D, netD.D)):
        for a, b in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("precision", [Precision.bf16, Precision.fp16])
def test_reduced_precision_losses_track_fp32_over_20_steps(precision):
    """Mean |loss difference| < 0.1 and every step within 0.5 of fp32: trajectories, not bits."""
    trajectories = []
    for each in (Precision.fp32, precision):  # D and G losses of the real steps on the same data, noise and seed
        cfg = compose_config()
        torch.manual_seed(0)
        G, D = build_models(cfg, CPU)
        opt_g, opt_d = build_optimizer(G, cfg, CPU), build_optimizer(D, cfg, CPU)
        ctx = step_context(each, CPU, skip_nonfinite=False)
        data, losses = torch.Generator().manual_seed(1), []
        for _ in range(20):
            real = torch.rand(32, 1, 16, 16, generator=data) * 2 - 1
            z = torch.randn(32, cfg.model.z_dim, generator=data)
            with ctx.autocast():
                fake = G(z)
            d_stats, features = d_step(D, opt_d, real, fake, ctx)
            g_stats = g_step(D, G, opt_g, fake, features, ctx)
            ctx.scaler.update()
            losses.append([d_stats["loss/d"].item(), g_stats["loss/g"].item()])
        trajectories.append(torch.tensor(losses))
    reference, reduced = trajectories
    difference = (reference - reduced).abs()
    assert difference.mean() < 0.1, difference
    assert difference.max() < 0.5, difference
    assert not torch.equal(reference, reduced)  # reduced precision really ran


# PyTorch facts (not proofs of this project's code): none calls the step it illustrates ==========


def test_without_detach_d_loss_reaches_generator(tiny_gan):
    G, D = tiny_gan
    real, fake = batch(G)
    BCE.d(D(real), D(fake)).backward()  # what d_step would do without .detach()
    assert all(p.grad is not None for p in G.parameters())


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
