"""gan/training/: precision, compile, host memory, the schedule, each tool, the held-out split; the benchmarks."""

from __future__ import annotations

import copy
import json
import logging
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, compose_config, output_of, run_script, run_train
from test_datasets import HELD_OUT_DAMAGE, damaged_mnist, write_image
from test_watching import LOSS_CHARTS, events_of
from torch.utils.flop_counter import FlopCounterMode

import gan.training.state
from gan.checkpoint import load_checkpoint
from gan.config import ConfigError, ModelConfig, Precision
from gan.core.models import Discriminator, Generator
from gan.data import EmptySplitError, is_held_out, load_dataset
from gan.errors import CheckpointError, MetricsError
from gan.evaluation import metrics as M
from gan.training import train
from gan.training.loop import build_probes
from gan.training.monitor import FAKE_TAG, RAW_FAKE_TAG, REAL_TAG
from gan.training.state import lr_scale, resolve_precision
from gan.world import SINGLE
from scripts.bench import Row, flops_per_step, probe, project_config
from scripts.bench_parts import conv_share

CPU = torch.device("cpu")
CUDA = "trainer.device=cuda"


@pytest.mark.parametrize(
    "overrides",
    [
        *([f"trainer.precision={p}"] for p in ("fp32", "bf16", "fp16", "auto")),
        ["experiment=wgan_gp"],
        ["loss=hinge", "model.spectral_norm=true", "model.d_batchnorm=false"],
        ["model.pack=2", "loss.real_label=0.9", "optim.lr_d=4e-4"],
        ["model.minibatch_std=4", "model.pack=2"],
        ["loss.r1=1.0", "model.d_batchnorm=false"],
        ["model.ema_decay=0"],
        ["model.ema_kimg=1", "loss.feature_matching=1"],
        ["loss=hinge", "optim.lr=1e-4"],
        ["trainer.channels_last=false", "trainer.precision=bf16", "trainer.retain_host_memory=false"],
        *(pytest.param([CUDA, f"trainer.precision={p}"], marks=pytest.mark.cuda) for p in ("fp16", "bf16")),
        pytest.param([CUDA, "trainer.compile=true", "trainer.precision=bf16"], marks=pytest.mark.cuda),
    ],
    ids=" ".join,
)
def test_each_precision_and_tool_trains(tmp_path, overrides, monkeypatch):
    """Finite float32 weights whatever the precision; the loss group the same four charts whatever the loss."""
    calls = []
    monkeypatch.setattr(gan.training.state, "retain_freed_memory", lambda: calls.append(True) or True)
    cfg = compose_config("trainer.max_steps=3", *overrides)
    result = train(cfg, tmp_path)
    metrics, state = result.metrics, load_checkpoint(tmp_path)
    assert calls == ([True] if cfg.trainer.device == "cpu" and cfg.trainer.retain_host_memory else [])  # glibc's
    # fp16 on a GPU: GradScaler's first scale (2**16) may overflow, a skipped step whose grad norm reads inf; no other
    overflowed = state.get("scaler", {}).get("scale", 2.0**16) < 2.0**16
    finite = [math.isfinite(v) for key, v in metrics.items() if not (overflowed and key.startswith("train/grad_norm"))]
    assert result.step == 3 and all(finite)
    # D's probabilities under every loss on one [0, 1] axis; raw scores, a loss's terms and D_G_z2 under train/
    assert sorted(key for key in metrics if key.startswith("loss/")) == sorted(LOSS_CHARTS)
    assert all(0 <= metrics[tag] <= 1 for tag in ("loss/D(x)", "loss/D(G(z))"))
    assert "train/D(G(z))_after_d_step" in metrics
    assert ("train/D(x)_score" in metrics) == (cfg.loss.name != "bce") == ("train/D(G(z))_score" in metrics)
    assert not [key for key in metrics if key.startswith(("d/", "grad_norm/", "perf/"))]
    grid = RAW_FAKE_TAG if "model.ema_decay=0" in overrides else FAKE_TAG  # without an EMA: G's own grid
    assert set(events_of(tmp_path / "tb").Tags()["images"]) == {REAL_TAG, grid}
    weights = [t for net in ("G", "D") for t in state[net].values() if t.is_floating_point()]
    # autocast runs the convolutions in 16 bits; the weights (and Adam's moments) stay float32, and finite
    assert {t.dtype for t in weights} == {torch.float32} and all(torch.isfinite(t).all() for t in weights)
    if "trainer.precision=fp16" in overrides:
        assert state["scaler"]["scale"] > 0  # the GradScaler ran, and its scale is saved for resume
    else:
        assert not state["scaler"]  # no scaler outside fp16: bf16 has float32's exponent range


# each loss key, set, shows in what a run logs: it reached the steps (test_mutations.py drops each on its way)
G_TERMS = {"train/grad_norm_g_adv", "train/grad_norm_g_fm", "train/loss_g_adv", "train/loss_g_fm"}
KEYS_LOGGED = [
    (["loss=wgan_gp"], {"train/loss_d_gp"}),
    (["loss.r1=1.0"], {"train/loss_d_r1"}),
    (["loss.feature_matching=1.0", "loss.backward_mode=separate"], G_TERMS),
]


def test_each_loss_key_reaches_the_steps(tmp_path, one_thread):
    for i, (overrides, logged) in enumerate(KEYS_LOGGED):
        metrics = train(compose_config("trainer.max_steps=2", *overrides), tmp_path / str(i)).metrics
        assert logged <= set(metrics) and all(metrics[key] > 0 for key in logged), (overrides, sorted(metrics))


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.pack=3", "model.pack=3 must divide data.batch_size (32)"),
        ("model.minibatch_std=-1", "model.minibatch_std=-1 must be >= 0"),
        ("optim.lr_decay=1.5", "optim.lr_decay=1.5 must be in [0, 1]"),
        ("model.ema_kimg=-1", "model.ema_kimg=-1.0 must be >= 0"),
        ("model.ema_every=0", "model.ema_every=0 must be >= 1"),
        ("model.ada_target=1.5", "model.ada_target=1.5 must be in [0, 1)"),
        ("model.ada_kimg=0", "model.ada_kimg=0.0 must be > 0"),
    ],
)
def test_a_tool_setting_out_of_range_is_refused_naming_it(override, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        compose_config(override)


def test_auto_precision_follows_the_hardware(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    for fast, expected in ((True, Precision.bf16), (False, Precision.fp32)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda fast=fast: fast, raising=False)
        assert resolve_precision(Precision.auto, CPU) == expected
    assert resolve_precision(Precision.fp16, CPU) == Precision.fp16


def test_both_optimizers_follow_the_schedule_in_training_d_at_its_own_rate(tmp_path):
    # 10 steps, the last half decaying: updates 1-6 at full rate (the 6th is 5/5), then 4/5, ..., 1/5
    assert [lr_scale(step, 10, 0.5) for step in range(10)] == pytest.approx([1, 1, 1, 1, 1, 1, 0.8, 0.6, 0.4, 0.2])
    assert [lr_scale(step, 10, 0.0) for step in range(10)] == [1.0] * 10  # 0: constant
    assert lr_scale(0, 4, 1.0) == 1 and lr_scale(3, 4, 1.0) == pytest.approx(0.25)  # the whole run
    cfg = compose_config("trainer.max_steps=4", "optim.lr=1e-3", "optim.lr_d=4e-3", "optim.lr_decay=0.5")
    seen = []
    train(cfg, tmp_path / "run", after_step=lambda s: seen.append((s.opt_g.param_groups[0]["lr"],
                                                                    s.opt_d.param_groups[0]["lr"])))  # fmt: skip
    # the rate of each update 1..4: full, full, full, then half (update 4 after 3 of 4 steps: 1/2)
    assert seen == [pytest.approx((g, 4 * g)) for g in (1e-3, 1e-3, 1e-3, 5e-4)]


@pytest.mark.parametrize(
    "device, tolerance, grad_tolerance",
    [
        pytest.param("cpu", (1e-4, 1e-5), (1e-3, 1e-5), marks=pytest.mark.slow),
        # TF32 (torch's default for cuDNN convolutions) may be used in both, differently
        pytest.param("cuda", (1e-3, 1e-3), (1e-2, 1e-3), marks=pytest.mark.cuda),
    ],
)
def test_compiled_networks_match_eager(device, tolerance, grad_tolerance):
    torch.manual_seed(0)
    G, D = Generator(16, 8, 1, 16).to(device), Discriminator(8, 1, 16).to(device)
    eager_G, eager_D = copy.deepcopy(G), copy.deepcopy(D)
    gan.training.state.compile_models(G, D)
    images, eager_images = G(z := torch.randn(8, 16, device=device)), eager_G(z)
    (logits, features), eager = D(images, with_features=True), eager_D(eager_images, with_features=True)
    for ours, theirs in zip((images, logits, features), (eager_images, *eager)):
        torch.testing.assert_close(ours, theirs, rtol=tolerance[0], atol=tolerance[1])
    assert G.state_dict().keys() == eager_G.state_dict().keys()  # checkpoints stay interchangeable
    (logits.sum() + eager[0].sum()).backward()
    for a, b in zip(G.parameters(), eager_G.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=grad_tolerance[0], atol=grad_tolerance[1])


def test_compiled_on_a_gpu_the_models_stay_in_contiguous_memory():
    # channels_last G compiled on an H200: its first backward failed, inductor mispredicts strides (pytorch#171622)
    layout, cuda, cpu = gan.training.state.memory_format, torch.device("cuda"), torch.device("cpu")
    compiled, nchw = compose_config("trainer.compile=true"), compose_config("trainer.channels_last=false")
    assert layout(compose_config(), cuda) == layout(compiled, cpu) == torch.channels_last
    assert layout(compiled, cuda) == layout(nchw, cpu) == torch.contiguous_format


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
        command = [sys.executable, "-c", _PAGE_FAULTS, mode]
        out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout
        return json.loads(out.strip().splitlines()[-1])

    default, retained = run("default"), run("retain")
    assert retained["retained"] and not default["retained"]
    assert default["faults"] >= 100  # glibc's default: each allocation a fresh mmap, its pages fault at first touch
    assert retained["faults"] * 10 < default["faults"]  # retained: the freed block is reused, its pages stay mapped


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


def test_bench_counts_each_loops_own_flops_and_bench_parts_the_convolutions_alone():
    """bench.py's GFLOP/step: the canonical step's work less D's weight gradients in the G step (D frozen)."""
    size, channels, batch, z_dim, width = 32, 1, 4, 8, 8
    cfg = project_config(size, channels, batch, z_dim, width, 1, Precision.fp32)  # DCGAN's D, as canonical's
    canonical = flops_per_step(size, channels, batch, z_dim, width)
    project = flops_per_step(size, channels, batch, z_dim, width, cfg)
    D = Discriminator(width, channels, size)
    images = torch.randn(batch, channels, size, size)  # D's input gradient alone: what the G step needs
    with FlopCounterMode(display=False) as both:
        D(images.requires_grad_()).sum().backward()
    with FlopCounterMode(display=False) as input_only:
        D.requires_grad_(False)(images).sum().backward()
    assert canonical - project == both.get_total_flops() - input_only.get_total_flops() > 0
    rgb, kernel = torch.randn(8, 3, 32, 32), torch.randn(16, 3, 3, 3)  # bench_parts.py's share of convolutions
    assert conv_share(lambda: torch.nn.functional.conv2d(rgb, kernel), 3) > 0.5
    assert conv_share(lambda: (rgb * 2).sum(), 3) == 0


def test_a_final_evaluation_that_cannot_pass_is_refused_before_training(tmp_path, monkeypatch):
    untrained = M.Classifier(1, 10, width=4, feature_dim=8)
    monkeypatch.setattr(M, "train_classifier", lambda *args: (untrained, 0.5))  # below its 97% bar
    cfg = compose_config("trainer.final_eval_samples=100", f"data.root={tmp_path / 'data'}")
    with pytest.raises(MetricsError, match=r"trainer.final_eval_samples=100: The metrics classifier .* 50.00%"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


# a diagnostic only, the split warns once; final_eval_samples measures on it, eval_every tests its classifier on it
HELD_OUT_RUNS = [
    *(pytest.param(damage, [], 0, [HELD_OUT_DAMAGE[damage], "evaluate.py"], id=damage) for damage in HELD_OUT_DAMAGE),
    pytest.param("truncated", ["trainer.final_eval_samples=20"], 2,
                 ["is truncated", "trainer.final_eval_samples=20 measures the trained generator"], id="final_eval"),
    pytest.param("out of range", ["trainer.eval_every=2", "trainer.eval_samples=10", "trainer.overfit_every=0"], 2,
                 ["holds values from 5 to 12"], id="eval_every"),
]  # fmt: skip


@pytest.mark.parametrize("damage, measuring, code, expected", HELD_OUT_RUNS)
def test_a_run_that_measures_on_the_held_out_split_stops_on_damaged_test_labels(
    tmp_path, damage, measuring, code, expected
):
    labels, run_dir = damaged_mnist(tmp_path / "data", damage), tmp_path / "run"
    result = run_train("data=mnist", f"data.root={tmp_path / 'data'}", *measuring, f"hydra.run.dir={run_dir}")
    output = output_of(result)
    assert result.returncode == code and "Traceback" not in output, output[-3000:]
    said = [line for line in output.splitlines() if str(labels) in line]  # one paragraph, naming the file
    assert len(said) == 1 and all(text in said[0] for text in expected), output[-3000:]
    assert ("[WARNING]" in said[0]) == (code == 0) and (run_dir / "checkpoints").exists() == (code == 0)


def test_a_folder_too_small_for_a_held_out_split_is_only_noted(tmp_path, caplog):
    # not damage: the held-out split is simply empty, and the run goes on with an INFO line as before
    folder = tmp_path / "images"
    names = [f"{i:03d}.png" for i in range(60) if not is_held_out(Path(f"{i:03d}.png"))]
    for i, name in enumerate(names):
        write_image(folder / name, (16, 16), seed=i)
    cfg = compose_config("data=folder", f"data.root={folder}", "data.channels=3")
    with pytest.raises(EmptySplitError):
        load_dataset(cfg.data, train=False)
    with caplog.at_level(logging.INFO, logger="gan.training.loop"):
        assert build_probes(cfg, load_dataset(cfg.data), CPU, SINGLE) == (None, None)
    assert [r.levelname for r in caplog.records if "held-out" in r.getMessage()] == ["INFO"]


def test_a_data_position_beyond_an_epoch_is_refused_when_the_stream_is_rebuilt(tiny_run, tmp_path):
    # 256 images / 32 a batch = 8 batches an epoch; step 40 could reach batch 20, no epoch has one
    state = {**torch.load(tiny_run / "checkpoints" / "last.pt", weights_only=True), "step": 40}
    torch.save({**state, "data": {"epoch": 0, "batch": 20}}, tmp_path / "far.pt")
    said = "entry 'data' places the batch stream at batch 20 of epoch 0, past an epoch's end: 256 images make 8 "
    with pytest.raises(CheckpointError, match=re.escape(said + "batches of data.batch_size=32")):
        train(compose_config(f"trainer.resume={tmp_path / 'far.pt'}", "trainer.max_steps=42"), tmp_path / "out")
    assert not (tmp_path / "out" / "checkpoints").exists()


BAD_SCRIPT_ARGUMENTS = {  # each refused before any work (a benchmark's was a traceback, after work)
    "bench --rounds 0": (["bench.py", "--rounds", "0"], "--rounds"),
    "bench --precisions fp64": (["bench.py", "--precisions", "fp64"], "invalid choice: 'fp64'"),
    "bench_parts --sizes 24": (["bench_parts.py", "--sizes", "24"], "--sizes powers of two"),
    "longer --plot without NAME=": (["longer.py", "--plot", "runs", "--out", "x.png"], "each run is NAME=DIR"),
    "sweep_table of a folder without runs": (["sweep_table.py", "."], "No runs under ."),
    # compare.py: before either side trains; a range gan/config.py checks too
    "compare model.nope=1": (["compare.py", "model.nope=1", "--out", "race"], "do not make a train.py config"),
    "compare metrics.nope=1": (["compare.py", "metrics.nope=1", "--out", "race"], "metrics.* override"),
    "compare optim.lr=-1": (["compare.py", "optim.lr=-1", "--out", "race"], "optim.lr=-1.0 must be > 0"),
}


@pytest.mark.parametrize("case", BAD_SCRIPT_ARGUMENTS)
def test_a_script_refuses_an_argument_it_cannot_use_before_it_works(case, tmp_path):
    args, says = BAD_SCRIPT_ARGUMENTS[case]
    result = run_script(*args, cwd=tmp_path)
    assert result.returncode == 2 and says in result.stderr and "Traceback" not in output_of(result)
    assert not any(tmp_path.iterdir())
