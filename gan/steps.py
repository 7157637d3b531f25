"""One optimisation step per network: where the autograd techniques of this project live.

Owns the order of forward, backward and update for D and for G, and the isolation between them:
  - the D step sees `fake.detach()`, so D's loss never reaches G's parameters;
  - the G step runs D with `requires_grad_(False)`, so G's loss never fills D's `.grad`;
  - gradients live only inside the step that makes them: `param.grad = None` right after the update.
It leaves the math to `gan.losses`, and cadence (logging, sampling, checkpoints) to `gan.training`.

Each step returns its diagnostics as 0-dim tensors still on the device: turning them into Python
numbers (`.item()`) forces a host sync, so the loop does that only at log time.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Iterable, Iterator

import torch
from torch import Tensor, nn

from gan.config import BackwardMode
from gan.losses import AdversarialLoss, feature_matching


def d_step(D: nn.Module, opt_d: torch.optim.Optimizer, loss: AdversarialLoss,
           real: Tensor, fake: Tensor, autocast: Callable[[], ContextManager] = contextlib.nullcontext,
           skip_nonfinite: bool = False) -> tuple[dict[str, Tensor], Tensor]:
    """(1) Update D: minimise loss.d(D(x), D(G(z))); for bce, maximise log D(x) + log(1 - D(G(z))).

    Returns the diagnostics and D's features of the real batch (detached), which the G step reuses
    for feature matching instead of running D on the real batch a second time.
    """
    with autocast():  # forward passes only: backward runs in the dtypes autocast chose for them
        real_logits, real_features = D.forward_with_features(real)
        # detach(): a new tensor on the same storage with no history. D's loss stops at the fake
        # images and cannot fill G's .grad (pytorch/examples#116); G's forward is not repeated.
        fake_logits = D(fake.detach())
        loss_d = loss.d(real_logits, fake_logits)
    loss_d.backward()
    grad_norm = total_norm(D.parameters())
    update(opt_d, loss_d, skip_nonfinite)
    release_grads(D)
    stats = {"loss/d": loss_d.detach(), "grad_norm/d": grad_norm,
             "d/real": torch.sigmoid(real_logits.detach()).mean(),  # D(x): probability "real" on data
             "d/fake": torch.sigmoid(fake_logits.detach()).mean()}  # D(G(z)) before this update
    return stats, real_features.detach()


def g_step(D: nn.Module, G: nn.Module, opt_g: torch.optim.Optimizer, loss: AdversarialLoss,
           fake: Tensor, real_features: Tensor, feature_matching_weight: float = 0.0,
           backward_mode: BackwardMode = BackwardMode.summed,
           autocast: Callable[[], ContextManager] = contextlib.nullcontext,
           skip_nonfinite: bool = False) -> dict[str, Tensor]:
    """(2) Update G: minimise loss.g(D(G(z))) [+ w * feature matching]; for bce, maximise log D(G(z)).

    `fake` is G's output with its graph (the same batch the D step saw detached).
    """
    # retain_grad(): `fake` is not a leaf, so autograd would drop its gradient after use. Keeping it
    # shows how strongly D pushes on the images, a diagnostic of the adversarial signal.
    fake.retain_grad()
    with frozen(D):
        with autocast():
            fake_logits, fake_features = D.forward_with_features(fake)
            terms = {"adv": loss.g(fake_logits)}
            if feature_matching_weight > 0:
                terms["fm"] = feature_matching_weight * feature_matching(real_features, fake_features)
        norms = backward_terms(terms, list(G.parameters()), backward_mode)
    loss_g = sum(terms.values()).detach()
    update(opt_g, loss_g, skip_nonfinite)
    release_grads(G)
    stats = {"loss/g": loss_g, "grad_norm/g": norms.pop("total"),
             "grad_norm/images": fake.grad.flatten(1).norm(dim=1).mean()}
    stats.update({f"loss/g_{name}": value.detach() for name, value in terms.items() if len(terms) > 1})
    stats.update({f"grad_norm/g_{name}": value for name, value in norms.items()})
    return stats


def backward_terms(terms: dict[str, Tensor], params: list[Tensor],
                   mode: BackwardMode) -> dict[str, Tensor]:
    """Backpropagate a multi-term loss; returns gradient norms: 'total', plus one per term if separate.

    summed: one backward of the sum, the usual and cheapest form.
    separate: one backward per term. The terms share one graph (through D and G), and backward()
    frees a graph's saved tensors as it goes, so every call but the last passes retain_graph=True;
    without it the next call raises "Trying to backward through the graph a second time". The
    gradients accumulate in .grad, so both modes leave the same .grad; each term's own norm is the
    growth of .grad during its call.
    """
    if mode == BackwardMode.summed or len(terms) == 1:
        sum(terms.values()).backward()
        return {"total": total_norm(params)}
    norms: dict[str, Tensor] = {}
    before = [torch.zeros_like(p) for p in params]
    for i, (name, term) in enumerate(terms.items()):
        last = i == len(terms) - 1
        term.backward(retain_graph=not last)
        after = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]
        norms[name] = total_norm_of([a - b for a, b in zip(after, before)])
        before = after
    norms["total"] = total_norm(params)
    return norms


def update(optimizer: torch.optim.Optimizer, loss: Tensor, skip_nonfinite: bool) -> None:
    """optimizer.step(), unless skip_nonfinite and the loss is NaN/inf (that check syncs with the device)."""
    if skip_nonfinite and not torch.isfinite(loss):
        return
    optimizer.step()


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[nn.Module]:
    """requires_grad_(False) on every parameter inside the block, then each flag as it was.

    A frozen D still passes gradient through to its input (the fake images, hence G) but builds no
    gradient for its own weights: its .grad stays None and no time goes into D's weight gradients.
    (no_grad() would cut the path to G too; eval() would only change BatchNorm.)
    """
    flags = [p.requires_grad for p in module.parameters()]
    module.requires_grad_(False)
    try:
        yield module
    finally:
        for p, flag in zip(module.parameters(), flags):
            p.requires_grad_(flag)


def release_grads(module: nn.Module) -> None:
    """param.grad = None after the update, as optimizer.zero_grad(set_to_none=True) does.

    Rather than zeroing in place: no memset, the memory is free while the other network trains, a
    stale gradient can never leak into a later step, and Adam skips any parameter whose .grad is
    None instead of updating it with a zero gradient (which would still move it by momentum).
    """
    for p in module.parameters():
        p.grad = None


def total_norm(params: Iterable[Tensor]) -> Tensor:
    """L2 norm of all gradients together, as a 0-dim tensor (no host sync)."""
    return total_norm_of([p.grad for p in params if p.grad is not None])


def total_norm_of(tensors: list[Tensor]) -> Tensor:
    if not tensors:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors)))
