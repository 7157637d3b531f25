"""The fast path: precision modes, compile, fused Adam — same math as the canonical step."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import compose_config

import gan.training.hardware
from gan.config import ModelConfig, Precision
from gan.core.models import Discriminator, Generator
from gan.core.steps import d_step, g_step
from gan.training import train
from gan.training.hardware import resolve_precision, step_context
from gan.training.state import build_models, build_optimizer
from scripts.bench import Row, SigmoidD, canonical_step, probe, project_config

CPU = torch.device("cpu")


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "auto"])
def test_each_precision_trains(tmp_path, precision):
    result = train(compose_config("trainer.max_steps=3", f"trainer.precision={precision}"), tmp_path)
    assert result.step == 3
    assert all(torch.isfinite(torch.tensor(v)) for v in result.metrics.values())
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert state["G"]["net.0.weight"].dtype == torch.float32  # autocast keeps fp32 master weights
    assert bool(state["scaler"]) == (precision == "fp16")  # a GradScaler only for fp16


def test_auto_precision_follows_the_hardware(monkeypatch):
    monkeypatch.setattr(gan.training.hardware, "cpu_has_fast_bf16", lambda: True)
    assert resolve_precision(Precision.auto, CPU) == Precision.bf16
    monkeypatch.setattr(gan.training.hardware, "cpu_has_fast_bf16", lambda: False)
    assert resolve_precision(Precision.auto, CPU) == Precision.fp32
    assert resolve_precision(Precision.fp16, CPU) == Precision.fp16


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
    canon_g = torch.optim.Adam(netG.parameters(), lr=cfg.optim.lr, betas=betas)
    canon_d = torch.optim.Adam(netD.parameters(), lr=cfg.optim.lr, betas=betas)
    ctx = step_context(Precision.fp32, CPU, skip_nonfinite=False)
    for _ in range(2):
        real = torch.rand(32, 1, 16, 16) * 2 - 1
        z = torch.randn(32, cfg.model.z_dim)
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


def loss_trajectory(precision: Precision, steps: int = 20) -> torch.Tensor:
    """(steps, 2) D and G losses of the real step functions on fixed data, noise and seed."""
    cfg = compose_config()
    torch.manual_seed(0)
    G, D = build_models(cfg, CPU)
    opt_g, opt_d = build_optimizer(G, cfg, CPU), build_optimizer(D, cfg, CPU)
    ctx = step_context(precision, CPU, skip_nonfinite=False)
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        real = torch.rand(32, 1, 16, 16, generator=data) * 2 - 1
        z = torch.randn(32, cfg.model.z_dim, generator=data)
        with ctx.autocast():
            fake = G(z)
        d_stats, features = d_step(D, opt_d, real, fake, ctx)
        g_stats = g_step(D, G, opt_g, fake, features, ctx)
        ctx.scaler.update()
        losses.append([d_stats["loss/d"].item(), g_stats["loss/g"].item()])
    return torch.tensor(losses)


@pytest.mark.parametrize("precision", [Precision.bf16, Precision.fp16])
def test_reduced_precision_losses_track_fp32_over_20_steps(precision):
    """Stated tolerance: mean |loss difference| < 0.1 and every step within 0.5 of fp32.

    Rounding differences grow with GAN dynamics (each step feeds the next its rounded weights), so
    this compares trajectories, not bits; the bits are compared for fp32 against the canonical step.
    """
    reference, reduced = loss_trajectory(Precision.fp32), loss_trajectory(precision)
    difference = (reference - reduced).abs()
    assert difference.mean() < 0.1, difference
    assert difference.max() < 0.5, difference
    assert not torch.equal(reference, reduced)  # reduced precision really ran


@pytest.mark.slow
def test_compiled_networks_match_eager():
    torch.manual_seed(0)
    G, D = Generator(16, 8, 1, 16), Discriminator(8, 1, 16)
    eager_G, eager_D = copy.deepcopy(G), copy.deepcopy(D)
    gan.training.hardware.compile_models(G, D)
    z = torch.randn(8, 16)
    images, eager_images = G(z), eager_G(z)
    torch.testing.assert_close(images, eager_images, rtol=1e-4, atol=1e-5)
    logits, features = D(images, with_features=True)
    eager_logits, eager_features = eager_D(eager_images, with_features=True)
    torch.testing.assert_close(logits, eager_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(features, eager_features, rtol=1e-4, atol=1e-5)
    assert G.state_dict().keys() == eager_G.state_dict().keys()  # checkpoints stay interchangeable
    logits.sum().backward()
    eager_logits.sum().backward()
    for a, b in zip(G.parameters(), eager_G.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-5)


# A fresh interpreter per case: the allocator option is process-wide and cannot be undone.
_PAGE_FAULTS = """
import json, resource, sys, torch
from gan.device import retain_freed_memory
retained = retain_freed_memory() if sys.argv[1] == "retain" else False
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):  # warm-up: the heap grows to its steady state
    torch.empty(48 << 20, dtype=torch.uint8).fill_(1)
counts = []
for _ in range(3):  # three rounds; the quietest one counts (the heap may still grow in the first)
    before = faults()
    for _ in range(10):  # 48 MiB: above glibc's largest default mmap threshold (32 MiB)
        torch.empty(48 << 20, dtype=torch.uint8).fill_(1)
    counts.append(faults() - before)
print(json.dumps({"retained": retained, "faults": min(counts)}))
"""


@pytest.mark.slow  # glibc's malloc settings are process-wide: each mode in a fresh process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc (mallopt)")
def test_retained_host_memory_stops_page_faults_on_reallocated_activations():
    def run(mode: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", _PAGE_FAULTS, mode],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        ).stdout
        return json.loads(out.strip().splitlines()[-1])

    default, retained = run("default"), run("retain")
    assert retained["retained"] and not default["retained"]
    # glibc's default: every allocation is a fresh mmap whose pages fault again on first touch
    # (122,880 faults with 4 KiB pages; fewer where transparent huge pages back the mapping)
    assert default["faults"] >= 100
    # retained: once the heap has grown, the freed block is reused and its pages stay mapped
    assert retained["faults"] * 10 < default["faults"]


def test_trainer_retains_host_memory_only_when_configured(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(gan.training.hardware, "retain_freed_memory", lambda: calls.append(True) or True)
    train(compose_config("trainer.max_steps=1", "trainer.retain_host_memory=false"), tmp_path / "off")
    assert calls == []
    train(compose_config("trainer.max_steps=1"), tmp_path / "on")
    assert calls == [True]


@pytest.mark.slow  # five fresh processes: a fresh process per row is what the benchmark promises
def test_bench_measures_each_row_in_a_fresh_process():
    # the benchmark's rows (python -m scripts.bench), tiny: a rate and a peak memory come back for each kind
    rows = (Row("canonical", 16), Row("canonical", 16, retain=True), Row("project", 16, "bf16"))
    for row in (*rows, Row("project", 16, "bf16", dcgan_d=False)):
        assert probe(row, "speed", batch=8, z_dim=8, width=8, steps=3) > 0
    assert probe(Row("project", 16), "memory", batch=8, z_dim=8, width=8, steps=3) >= 0
    # the project's rows time the canonical side's D (DCGAN's) unless a row asks for the default D
    same = project_config(16, 1, 8, 8, 8, 3, Precision.bf16).model
    default = project_config(16, 1, 8, 8, 8, 3, Precision.bf16, dcgan_d=False).model
    assert (same.d_batchnorm, same.spectral_norm) == (True, False)
    assert (default.d_batchnorm, default.spectral_norm) == (ModelConfig().d_batchnorm, ModelConfig().spectral_norm)


def test_bench_counts_each_loops_own_flops_the_frozen_d_saves_its_weight_gradients():
    """bench.py's GFLOP/step: the project's step does the canonical step's work less the weight gradients
    of D in the G step, which the canonical step computes (D not frozen) and zero_grad() throws away."""
    from torch.utils.flop_counter import FlopCounterMode

    from scripts.bench import flops_per_step

    size, channels, batch, z_dim, width = 32, 1, 4, 8, 8
    cfg = project_config(size, channels, batch, z_dim, width, 1, Precision.fp32)  # DCGAN's D, as canonical's
    canonical = flops_per_step(size, channels, batch, z_dim, width)
    project = flops_per_step(size, channels, batch, z_dim, width, cfg)
    D = Discriminator(width, channels, size)
    images = torch.randn(batch, channels, size, size)  # D's input gradient alone: what the G step needs
    with FlopCounterMode(display=False) as both:
        D(images.requires_grad_()).sum().backward()
    with FlopCounterMode(display=False) as input_only:
        D.requires_grad_(False)
        D(images).sum().backward()
    assert canonical - project == both.get_total_flops() - input_only.get_total_flops() > 0


def test_bench_parts_conv_share_counts_convolutions_alone():
    from scripts.bench_parts import conv_share

    images, kernel = torch.randn(8, 3, 32, 32), torch.randn(16, 3, 3, 3)
    assert conv_share(lambda: torch.nn.functional.conv2d(images, kernel), 3) > 0.5
    assert conv_share(lambda: (images * 2).sum(), 3) == 0
