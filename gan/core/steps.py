"""One optimisation step per network: where the autograd techniques of this project live (gan/core/__init__.py
lists them; docs/walkthrough.md, sections 3 and 4, explains them).
Each step returns its diagnostics as 0-dim tensors still on the device: `.item()` forces a host
sync, so the loop does that only at log time."""

import contextlib
import dataclasses
from typing import Callable, ContextManager, Iterable, Iterator, Optional

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from gan.core import BackwardMode
from gan.core.augment import no_augment
from gan.core.losses import LOSSES, AdversarialLoss, feature_matching, gradient_penalty, r1_penalty


@dataclasses.dataclass(frozen=True)
class Penalties:
    """Weights of D's regularisers; 0 turns one off."""

    gradient_penalty: float = 0.0  # WGAN-GP (Gulrajani et al. 2017), on interpolates
    r1: float = 0.0  # gamma of R1 (Mescheder et al. 2018), on real images


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What both steps share for a whole run: the objective, and how the arithmetic is done. `scaler`:
    fp16's GradScaler, one for both networks (PyTorch's AMP recipe for several optimizers); disabled,
    a pass-through. `augment`: what every image goes through on its way into D, in both steps."""

    loss: AdversarialLoss = LOSSES["bce"]
    penalties: Penalties = Penalties()
    feature_matching: float = 0.0
    backward_mode: BackwardMode = BackwardMode.summed
    autocast: Callable[[], ContextManager] = contextlib.nullcontext  # the forward passes' mixed precision
    scaler: torch.amp.GradScaler = dataclasses.field(default_factory=lambda: torch.amp.GradScaler("cpu", enabled=False))
    skip_nonfinite: bool = False  # trainer.on_nan=skip: drop an update whose loss is NaN/inf
    augment: Callable[[Tensor], Tensor] = no_augment


FP32 = StepContext()  # bce, no extra terms, fp32: both steps' default, which the tests use


def d_step(
    D: nn.Module, opt_d: Optimizer, real: Tensor, fake: Tensor, ctx: StepContext = FP32, y: Optional[Tensor] = None
) -> tuple[dict[str, Tensor], Tensor]:
    """(1) Update D: minimise loss.d(D(x), D(G(z))); for bce, maximise log D(x) + log(1 - D(G(z))).
    `y`: the batch's classes (conditional runs). Returns the diagnostics and D's features of the reals."""
    penalties = ctx.penalties
    if penalties.r1 > 0:  # R1 differentiates D(x) with respect to the images themselves
        real = real.detach().requires_grad_(True)
    with ctx.autocast():  # forward passes only: backward runs in the dtypes autocast chose for them
        real_logits, real_features = D(ctx.augment(real), y, with_features=True)
        # detach(): a new tensor on the same storage with no history. D's loss stops at the fake
        # images and cannot fill G's .grad (pytorch/examples#116); G's forward is not repeated.
        # Without it D's backward would run on through G's graph and free it, and the G step's
        # backward would raise "Trying to backward through the graph a second time".
        fake_logits = D(ctx.augment(fake.detach()), y)
        terms = {"adv": ctx.loss.d(real_logits, fake_logits)}
        if penalties.gradient_penalty > 0:  # on interpolates of a real and a fake of the same class y
            # fake.detach() again: an attached fake would let the penalty's backward run on into G, as above
            gp = gradient_penalty(lambda x: D(ctx.augment(x), y), real, fake.detach())
            terms["gp"] = penalties.gradient_penalty * gp
        if penalties.r1 > 0:
            terms["r1"] = penalties.r1 / 2 * r1_penalty(real_logits, real)
        loss_d = sum(terms.values())
    ctx.scaler.scale(loss_d).backward()
    ctx.scaler.unscale_(opt_d)  # true gradients for the norm below (a no-op unless fp16)
    grad_norm = total_norm(D.parameters())
    update(opt_d, loss_d, ctx)
    release_grads(D)
    stats = {"loss/d": loss_d.detach(), "grad_norm/d": grad_norm}
    stats.update(ctx.loss.scores(real_logits.detach(), fake_logits.detach()))
    # the overfitting heuristic r_t = E[sign(D(x))] of ADA (adaptive discriminator augmentation,
    # Karras et al. 2020, sec. 3): near 0 while D is unsure of the reals, toward 1 as it memorises them
    stats["d/overfit_rt"] = real_logits.detach().sign().mean()
    stats.update({f"loss/d_{name}": value.detach() for name, value in terms.items() if len(terms) > 1})
    return stats, real_features.detach()


def g_step(
    D: nn.Module,
    G: nn.Module,
    opt_g: Optimizer,
    fake: Tensor,
    real_features: Tensor,
    ctx: StepContext = FP32,
    y: Optional[Tensor] = None,
) -> dict[str, Tensor]:
    """(2) Update G: minimise loss.g(D(G(z))) [+ w * feature matching]; for bce, maximise log D(G(z)).
    `fake` is G's output with its graph (the batch the D step saw detached)."""
    # retain_grad(): `fake` is not a leaf, so autograd would drop its gradient after use. Keeping it
    # shows how strongly D pushes on the images, a diagnostic of the adversarial signal.
    fake.retain_grad()
    with frozen(D):
        with ctx.autocast():
            # ctx.augment: differentiable, so G's gradient flows back through it to `fake`
            fake_logits, fake_features = D(ctx.augment(fake), y, with_features=True)
            terms = {"adv": ctx.loss.g(fake_logits)}
            if ctx.feature_matching > 0:
                terms["fm"] = ctx.feature_matching * feature_matching(real_features, fake_features)
        term_norms = backward_terms(terms, list(G.parameters()), ctx.backward_mode, ctx)
    ctx.scaler.unscale_(opt_g)
    grad_norm = total_norm(G.parameters())
    loss_g = sum(terms.values()).detach()
    update(opt_g, loss_g, ctx)
    release_grads(G)
    images = fake.grad.flatten(1).norm(dim=1).mean() / ctx.scaler.get_scale()
    stats = {"loss/g": loss_g, "grad_norm/g": grad_norm, "grad_norm/images": images}
    stats.update({f"loss/g_{name}": value.detach() for name, value in terms.items() if len(terms) > 1})
    stats.update({f"grad_norm/g_{name}": value for name, value in term_norms.items()})
    # D(G(z)) again, now after D's update: pytorch/examples prints both as "D(G(z)): D_G_z1 / D_G_z2",
    # the D step's d/fake being the first. The gap is how much one D update learned about these fakes.
    after = ctx.loss.scores(fake_logits.detach(), fake_logits.detach())
    stats.update({f"{tag}_after_d_step": value for tag, value in after.items() if "fake" in tag})
    return stats


def backward_terms(
    terms: dict[str, Tensor], params: list[Tensor], mode: BackwardMode, ctx: StepContext = FP32
) -> dict[str, Tensor]:
    """Backpropagate a multi-term loss into .grad; in separate mode, returns each term's gradient norm.
    summed: one backward of the sum, the usual and cheapest form. separate: one backward per term. The terms share
    one graph (through D and G), and backward() frees its saved tensors as it goes, so every call but the last passes
    retain_graph=True; without it the next call raises "Trying to backward through the graph a second time". Both
    modes leave the same .grad; a term's own norm is the growth of .grad during its call."""
    if mode == BackwardMode.summed or len(terms) == 1:
        ctx.scaler.scale(sum(terms.values())).backward()
        return {}
    scale = ctx.scaler.get_scale()
    norms: dict[str, Tensor] = {}
    before = [torch.zeros_like(p) for p in params]
    for i, (name, term) in enumerate(terms.items()):
        last = i == len(terms) - 1
        ctx.scaler.scale(term).backward(retain_graph=not last)
        after = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]
        norms[name] = nn.utils.get_total_norm([a - b for a, b in zip(after, before)]) / scale
        before = after
    return norms


def update(optimizer: Optimizer, loss: Tensor, ctx: StepContext) -> None:
    """optimizer.step() through the scaler (which skips steps with inf/NaN gradients under fp16),
    and not at all if ctx.skip_nonfinite and the loss is NaN/inf (that check syncs with the device)."""
    if ctx.skip_nonfinite and not torch.isfinite(loss):
        return
    ctx.scaler.step(optimizer)


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[nn.Module]:
    """requires_grad_(False) on every parameter inside the block, then each flag as it was.
    A frozen D still passes gradient through to its input (the fake images, hence G) but builds no gradient for its
    own weights. (no_grad() would cut the path to G too; eval() would only change how BatchNorm normalises.) Its
    forward still updates its buffers (BatchNorm's statistics). Needed because this loop clears gradients after each
    update, not before each backward: unfrozen, D's next update would add G's loss gradient to its own.
    pytorch/examples' dcgan/main.py does not freeze D; its `netD.zero_grad()` wipes that gradient."""
    flags = [p.requires_grad for p in module.parameters()]
    module.requires_grad_(False)
    try:
        yield module
    finally:
        for p, flag in zip(module.parameters(), flags):
            p.requires_grad_(flag)


def release_grads(module: nn.Module) -> None:
    """param.grad = None after the update, as optimizer.zero_grad(set_to_none=True) does.
    `None` rather than zero frees the gradient's memory while the other network trains, and the next `backward()`
    writes a fresh gradient instead of adding to zeros. An optimizer skips a parameter whose `.grad` is `None`; a
    zero `.grad` is still stepped, which Adam's momentum (beta1 > 0, `experiment=paper`) turns into a move."""
    for p in module.parameters():
        p.grad = None


def total_norm(params: Iterable[Tensor]) -> Tensor:
    """L2 norm of all gradients together, as a 0-dim tensor on their device (no host sync)."""
    return nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
