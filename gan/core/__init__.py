"""The lesson: how a GAN is trained in PyTorch, in six short files that import torch (and
torchvision's make_grid, for sample grids) and nothing of the rest of this project. Read them top
to bottom, in this order:

1. `models.py`   Generator and Discriminator of DCGAN as pytorch/examples builds them; D returns logits.
                 The variants (conditional, minibatch std, packing, spectral norm) sit lower in the file.
2. `losses.py`   the adversarial losses (non-saturating bce, hinge, Wasserstein) and the penalties
                 (gradient penalty, R1, feature matching), as pure functions of D's logits.
3. `steps.py`    d_step and g_step: where every autograd technique lives —
                 `fake.detach()` in the D step; D frozen with `requires_grad_(False)` in the G step;
                 `backward(retain_graph=True)` for a G loss of several terms, one backward per term
                 (loss.backward_mode=separate; the default sums them, one backward); `param.grad = None`
                 after each update; `retain_grad()` on a non-leaf; autocast and GradScaler.
4. `ema.py`      the exponential moving average (EMA) of G's weights that every sample is drawn from.
5. `sampling.py` sampling under `eval()` + `no_grad()`, with the previous mode restored.
6. `augment.py`  DiffAugment: differentiable augmentations of every image D sees (small datasets).

With model.conditional=true the same steps train a class-conditional pair (G(z, y), a projection
D(x, y)): the classes travel with the batch, and nothing else in the steps changes.

The training loop that calls them, `gan/training/loop.py`, reads like pytorch/examples'
dcgan/main.py: fetch, (1) D step, (2) G step, EMA, log, sample, checkpoint."""

from enum import Enum


class BackwardMode(str, Enum):
    """How the G step backpropagates a loss of several terms (steps.backward_terms). It lives here, not in
    steps.py, so that gan/config.py names it without importing torch (shell completion, --help: no wait)."""

    summed = "summed"  # one backward() of the summed G objective
    separate = "separate"  # one backward() per term, retain_graph=True on all but the last
