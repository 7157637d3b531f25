"""gan/core/ema.py: the EMA of G's weights and statistics, its decay schedules, its updates, the grids drawn from it."""

import math
from typing import Any

import numpy as np
import pytest
import torch
from conftest import compose_config
from PIL import Image
from torch import Tensor, nn

from gan.checkpoint import load_checkpoint
from gan.core.ema import build_ema, ema_with_half_life, ema_with_warmup
from gan.core.sampling import image_grid, sample
from gan.evaluation.pipeline import build_generator
from gan.training import train
from gan.training.state import build_models


def after_a_jump(ema: Any, updates: int) -> float:
    """The EMA of a weight that was 0 at the EMA's first update (a copy) and 1 at the `updates` after it."""
    G = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        G.weight.fill_(0.0)
        ema.update_parameters(G)
        G.weight.fill_(1.0)
        for _ in range(updates):
            ema.update_parameters(G)
    return ema.module.weight.item()


def test_ema_decay_warms_up():
    # the update n = 1 keeps a decay of (1 + 1) / (10 + 1) = 2/11 of the average, not 0.999
    assert after_a_jump(build_ema(nn.Linear(1, 1, bias=False), decay=0.999), 1) == pytest.approx(1 - 2 / 11)
    # a half-life in images: 100 images per step, a half-life of 1,000 images: after the ramp-up each step keeps
    # 0.5 ** (100 / 1000) of the average, so 10 steps of a new value close half the gap
    G = nn.Linear(1, 1, bias=False)
    ema = build_ema(G, decay=0.0, kimg=1.0, rampup=0.0, images_per_step=100)
    assert after_a_jump(ema, 10) == pytest.approx(0.5, abs=1e-5)
    # ramp-up 0.5: after n updates the half-life is at most 0.5 (n + 1) x 100 images, so the
    # second update (n = 1) keeps 0.5 ** (100 / 100) = 0.5, not 0.5 ** 0.1
    ramped = build_ema(G, decay=0.0, kimg=1.0, rampup=0.5, images_per_step=100)
    assert after_a_jump(ramped, 1) == pytest.approx(0.5, abs=1e-6)
    cfg = compose_config("model.ema_kimg=10", "model.ema_decay=0")  # kimg alone turns the EMA on
    assert build_ema(G, cfg.model.ema_decay, cfg.model.ema_kimg, cfg.model.ema_rampup) is not None


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
    per_step, late = 0.999 if kind == "warm-up" else 0.5 ** (64 / 1000), [torch.zeros(1)]
    cadenced(late, [torch.ones(1)], torch.tensor(10**6))
    assert late[0].item() == pytest.approx(1 - per_step**every, abs=1e-6)  # float32 arithmetic


def test_the_loop_updates_the_ema_every_model_ema_every_steps(tmp_path, one_thread):
    """Updates after steps 3 and 6 only (the first copies G); the second by 1 - the decay of its 3 steps."""
    seen = []

    def record(state: Any) -> None:
        seen.append((int(state.G_ema.n_averaged), floats(state.G), floats(state.G_ema.module)))

    train(compose_config("trainer.max_steps=7", "model.ema_every=3"), tmp_path / "run", after_step=record)
    assert [n for n, _, _ in seen] == [0, 0, 1, 1, 1, 2, 2]
    (_, _, before), (_, g, after) = seen[4:6]  # after steps 5 and 6
    decay = math.prod(min(0.999, (1 + step) / (10 + step)) for step in (3, 4, 5))  # ema_with_warmup's
    torch.testing.assert_close(after, decay * before + (1 - decay) * g)


def test_ema_averages_weights_and_batchnorm_statistics():
    cfg = compose_config()
    G, _ = build_models(cfg, torch.device("cpu"))
    ema = build_ema(G, decay=0.5)
    for _ in range(20):  # past the warm-up: (1 + n) / (10 + n) > 0.5 from n = 9 on
        ema.update_parameters(G)
    before = floats(ema.module)
    with torch.no_grad():
        for p in G.parameters():
            p.add_(1.0)
        G(torch.randn(8, cfg.model.z_dim))  # moves BatchNorm's running statistics
    ema.update_parameters(G)
    torch.testing.assert_close(floats(ema.module), 0.5 * before + 0.5 * floats(G))  # every weight and statistic


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
        grid = image_grid(sample(G, state["fixed_z"]))  # as torchvision's save_image writes it: uint8 (H, W, 3)
        drawn[name] = grid.mul(255).add_(0.5).clamp_(0, 255).permute(1, 2, 0).to(torch.uint8).to(torch.int16)
    # the EMA's grid, up to a rounding of one level where thread counts order a sum differently
    assert (written.to(torch.int16) - drawn["EMA"]).abs().max() <= 1
    assert (written.to(torch.int16) - drawn["raw"]).abs().max() > 1  # and not G's own


def floats(module: nn.Module) -> Tensor:
    """Every floating-point weight and buffer (BatchNorm's statistics) of a module, as one vector."""
    return torch.cat([t.detach().flatten() for t in module.state_dict().values() if t.is_floating_point()])


def test_the_ema_generator_moves_toward_g_at_each_update(tmp_path, one_thread):
    """Each change after the first (a copy) moves every weight and statistic along G - EMA by one fraction in (0, 1)."""
    cfg = compose_config("trainer.max_steps=8", "optim.lr=0.01")  # big steps: rounding stays far below them
    seen: list[tuple[Tensor, Tensor]] = []

    def record(state: Any) -> bool:
        seen.append((floats(state.G), floats(state.G_ema.module)))
        return False

    train(cfg, tmp_path, after_step=record)
    fractions, first = [], True
    for (_, before), (g, after) in zip(seen, seen[1:]):
        if torch.equal(before, after):
            continue
        if first and torch.equal(after, g):  # AveragedModel's first update copies G; in this window if it is late
            first = False
            continue
        first = False
        toward, moved = g - before, after - before
        fraction = (moved @ toward / (toward @ toward)).item()
        assert 0.01 < fraction < 0.99, f"the EMA moved {fraction:.4f} of the way to G"
        assert (moved - fraction * toward).norm() <= 1e-3 * moved.norm(), "the EMA did not move along G - EMA"
        fractions.append(fraction)
    assert len(fractions) >= 3, f"the EMA averaged at {len(fractions)} of {len(seen) - 1} steps"
