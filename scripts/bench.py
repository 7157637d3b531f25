"""Benchmark: the canonical DCGAN step of pytorch/examples against this project's training loop.

    python scripts/bench.py                      # 32 and 64 px, every precision, prints a table
    python scripts/bench.py --sizes 64 --rounds 5 --steps 20 --compile
    python scripts/bench.py --device cuda --sizes 32 64 128 --steps 200 --compile --nchw
    python scripts/bench.py --device cuda --sizes 64 --batch 256 512 1024 --precisions bf16

Both sides train the same networks (this project's Generator and DCGAN's Discriminator, with
BatchNorm, so the model size is identical) on the same images at the same batch size; the rows
"project ..., default D" train train.py's default recipe instead (its D spectrally normalised without
BatchNorm, adaptive DiffAugment, the EMA), the whole loop a user runs, in each precision. The
canonical side is re-implemented as plain reference code in `canonical_step`: fp32, Sigmoid +
BCELoss, `zero_grad()`, a DataLoader.
The project side is the real `gan.training.train()` loop, logging, sampling and checkpointing
included. Rows alternate round by round, so load on the machine hits all alike, and the table
reports the median round. Each row runs in a fresh process (`probe`): the project's loop sets a
process-wide allocator option (trainer.retain_host_memory) that would otherwise leak into the
canonical rows, and peak memory needs a fresh RSS high-water mark. The row "canonical fp32 +
retain memory" is the canonical step with that allocator option, to show what it is worth alone
(CPU only). On CUDA both sides keep their models and batches on the GPU (the canonical side copies
each batch from its DataLoader, as the examples do), the clock stops after torch.cuda.synchronize(),
and peak memory is the GPU's (torch.cuda.max_memory_allocated), measured in the speed process.
GFLOP/step is each loop's own count (torch's FlopCounterMode over one step): the project's step does
fewer than the canonical one, which computes weight gradients for D in its G step that it throws away.

A program, not part of the library: the trainer imports nothing from it. `canonical_step` also
serves the test that checks the project's fp32 math against the canonical step.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repo's gan and scripts

from gan.config import DataConfig, ModelConfig, Precision, TrainConfig, TrainerConfig  # noqa: E402
from gan.core.models import Discriminator, Generator  # noqa: E402
from gan.core.steps import d_step, g_step  # noqa: E402
from gan.data import ImageSet  # noqa: E402
from gan.device import retain_freed_memory  # noqa: E402
from gan.training import train  # noqa: E402
from gan.training.state import build_state, build_step_context  # noqa: E402
from scripts.canonical_dcgan import iteration  # noqa: E402

log = logging.getLogger(__name__)


# the canonical step ------------------------------------------------------------------------------


class SigmoidD(nn.Module):
    """The canonical D ends in nn.Sigmoid: wrap a logits D to get the same function."""

    def __init__(self, D: nn.Module):
        super().__init__()
        self.D = D

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.D(x))


def canonical_step(
    netG: nn.Module,
    netD: nn.Module,
    optimizerG: torch.optim.Optimizer,
    optimizerD: torch.optim.Optimizer,
    real: Tensor,
    noise: Tensor,
) -> tuple[float, float]:
    """One iteration as pytorch/examples dcgan/main.py writes it (netD ends in a Sigmoid): the loop
    body of scripts/canonical_dcgan.py; returns D's and G's losses."""
    errD, errG, *_ = iteration(netG, netD, nn.BCELoss(), optimizerD, optimizerG, real, noise)
    return errD.item(), errG.item()


def run_canonical(
    images: Tensor, batch_size: int, z_dim: int, width: int, steps: int, seed: int = 0, device: str = "cpu"
) -> float:
    """Train `steps` canonical iterations; returns img/s after the first (warm-up) iteration."""
    torch.manual_seed(seed)
    channels, size = images.shape[1], images.shape[-1]
    netG = Generator(z_dim, width, channels, size).to(device)
    netD = SigmoidD(Discriminator(width, channels, size)).to(device)
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    loader = DataLoader(TensorDataset(images), batch_size=batch_size, shuffle=True, drop_last=True)
    done, start = 0, 0.0
    while done < steps:
        for (batch,) in loader:
            real = batch.to(device).float() / 127.5 - 1  # the examples' Normalize((0.5,), (0.5,))
            noise = torch.randn(batch_size, z_dim, 1, 1, device=device)
            canonical_step(netG, netD, optimizerG, optimizerD, real, noise)  # .item(): waits for the GPU
            done += 1
            if done == 1:
                start = time.perf_counter()
            if done == steps:
                break
    synchronize(device)
    return (steps - 1) * batch_size / (time.perf_counter() - start)


def synchronize(device: str | torch.device) -> None:
    """Wait for the GPU's queued work (CUDA kernels run after the Python call returns)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# the project's loop ------------------------------------------------------------------------------


def project_config(
    size: int,
    channels: int,
    batch_size: int,
    z_dim: int,
    width: int,
    steps: int,
    precision: Precision,
    compile: bool = False,
    device: str = "cpu",
    channels_last: bool = True,
    dcgan_d: bool = True,
) -> TrainConfig:
    """The project's run of a row. dcgan_d: D as the canonical side's (BatchNorm, no spectral norm), so
    both sides time the same networks; False: the default D (spectral norm, no BatchNorm)."""
    dcgan = {"d_batchnorm": True, "spectral_norm": False} if dcgan_d else {}
    return TrainConfig(
        data=DataConfig(image_size=size, channels=channels, batch_size=batch_size),
        model=ModelConfig(z_dim=z_dim, g_width=width, d_width=width, **dcgan),
        trainer=TrainerConfig(
            max_steps=steps,
            precision=precision,
            compile=compile,
            channels_last=channels_last,
            progress=False,
            device=device,
            threads=torch.get_num_threads(),  # fixed, as the canonical side's: no adapting (threads.py)
        ),
    )


def project_step(cfg: TrainConfig, p: float | None = None) -> Callable[[], None]:
    """One training step as train()'s loop runs it (its extras apart), ADA's p held at `p` (None: as built)."""
    device = torch.device("cpu")
    ctx, _ = build_step_context(cfg, device)
    channels, size = cfg.data.channels, cfg.data.image_size
    images = torch.randint(0, 256, (1024, channels, size, size), dtype=torch.uint8)
    state = build_state(cfg, device, ctx.scaler, dataset=ImageSet(images, torch.zeros(1024, dtype=torch.long), 1))
    if p is not None:
        ctx.augment.set_p(p)

    def step() -> None:
        real, y = state.batches.next_with_labels()
        z = torch.randn(real.size(0), cfg.model.z_dim)
        with ctx.autocast():
            fake = state.G(z, y)
        _, real_features = d_step(state.D, state.opt_d, real, fake, ctx, y)
        g_step(state.D, state.G, state.opt_g, fake, real_features, ctx, y)
        state.step += 1
        if state.G_ema is not None and state.step % cfg.model.ema_every == 0:
            state.G_ema.update_parameters(state.G)

    return step


def run_project(images: Tensor, cfg: TrainConfig) -> float:
    """The real training loop for cfg.trainer.max_steps steps; img/s after the first step."""
    dataset = ImageSet(images, torch.zeros(images.size(0), dtype=torch.long), 1)
    with tempfile.TemporaryDirectory() as run_dir:
        result = train(cfg, Path(run_dir), dataset=dataset)
    return (result.step - 1) * cfg.data.batch_size / result.seconds


# measurements -------------------------------------------------------------------------------------


def flops_per_step(
    size: int, channels: int, batch_size: int, z_dim: int, width: int, cfg: TrainConfig | None = None
) -> int:
    """Forward + backward FLOPs of one iteration, counted by torch's FlopCounterMode: the canonical one, or
    the project's step under `cfg` (no weight gradients for the frozen D in its G step: fewer FLOPs)."""
    if cfg is not None:
        step = project_step(cfg)
    else:
        netG, netD = Generator(z_dim, width, channels, size), SigmoidD(Discriminator(width, channels, size))
        opt_g, opt_d = torch.optim.Adam(netG.parameters()), torch.optim.Adam(netD.parameters())
        real = torch.rand(batch_size, channels, size, size) * 2 - 1
        step = functools.partial(canonical_step, netG, netD, opt_g, opt_d, real, torch.randn(batch_size, z_dim, 1, 1))
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def compute_ceiling(dtype: torch.dtype, seconds: float = 0.5, repeats: int = 3, device: str = "cpu") -> float:
    """The machine's practical peak FLOP/s in `dtype`: the best of large matmuls and a large 3x3
    convolution, best of `repeats`. Both count: on some CPUs torch's matmul library is slower than
    oneDNN's convolutions (fp32 on the AMD CPU of docs/speed.md), and a step is mostly convolutions.
    (fp32 on CUDA: torch's defaults, TF32 for convolutions and none for matmuls.)"""
    import torch.nn.functional as F

    def matmul(n: int) -> tuple[Callable[[], Tensor], float]:
        a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
        return (lambda: a @ b), 2 * n**3

    def conv() -> tuple[Callable[[], Tensor], float]:
        x = torch.randn(64, 256, 32, 32, dtype=dtype, device=device)
        w = torch.randn(256, 256, 3, 3, dtype=dtype, device=device)
        x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
        return (lambda: F.conv2d(x, w, padding=1)), 2 * 64 * 256 * 256 * 9 * 32 * 32

    best = 0.0
    for run, flops in (matmul(1024), matmul(2048), matmul(4096), conv()):
        run()  # warm-up
        for _ in range(repeats):
            synchronize(device)
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                run()
                count += 1
            synchronize(device)
            best = max(best, flops * count / (time.perf_counter() - start))
    return best


def channels_for(size: int) -> int:
    """64 px as the examples' RGB data; 32 px (and smaller) as MNIST-like grayscale."""
    return 3 if size >= 64 else 1


@dataclass(frozen=True)
class Row:
    """One line of the table: which loop, at which size and precision."""

    kind: str  # canonical | project
    size: int
    precision: str = "fp32"
    retain: bool = False  # the canonical step with the project's allocator setting (gan/device.py)
    compile: bool = False
    channels_last: bool = True  # the project's default layout; False: "NCHW" (the canonical layout)
    dcgan_d: bool = True  # False: the project's default D (spectral norm, no BatchNorm) instead of DCGAN's

    @property
    def name(self) -> str:
        extras = " + retain memory" if self.retain else " + compile" if self.compile else ""
        extras += "" if self.channels_last or self.kind == "canonical" else " NCHW"
        extras += "" if self.dcgan_d else ", default D"
        return f"{self.kind} {self.precision}{extras}"


def probe(row: Row, measure: str, batch: int, z_dim: int, width: int, steps: int, device: str = "cpu") -> float:
    """Run one row in a fresh Python process; returns its img/s ("speed") or peak MB ("memory")."""
    return probe_result(row, measure, batch, z_dim, width, steps, device)["value"]


def probe_result(
    row: Row, measure: str, batch: int, z_dim: int, width: int, steps: int, device: str = "cpu"
) -> dict[str, float]:
    """What `probe` measures, as the child reports it: {"value": ...}, plus {"gpu_mb": peak GPU
    memory} from a speed run on CUDA (the GPU's counter resets per process at no cost to speed).

    A fresh process per row and round: the allocator setting of the project's loop is process-wide
    and cannot be undone, so rows sharing a process would share it; and a process's RSS
    high-water mark cannot be reset, so peak memory needs its own process too.
    """
    spec = json.dumps(
        {
            "row": asdict(row),
            "measure": measure,
            "batch": batch,
            "z_dim": z_dim,
            "width": width,
            "steps": steps,
            "threads": torch.get_num_threads(),
            "device": device,
        }
    )
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--probe", spec], capture_output=True, text=True
    )
    if done.returncode != 0:  # the row reads nan and the table goes on; the error's last lines say why
        log.error("%s (%s) failed, exit %d:\n%s", row.name, measure, done.returncode, done.stderr[-2500:])
        return {"value": math.nan}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_probe(spec: dict) -> dict[str, float]:
    """The child side of `probe`: train one row and measure it."""
    torch.set_num_threads(spec["threads"])
    row, device = Row(**spec["row"]), spec.get("device", "cpu")
    channels = channels_for(row.size)
    torch.manual_seed(0)
    images = torch.randint(0, 256, (max(spec["batch"] * 8, 1024), channels, row.size, row.size), dtype=torch.uint8)
    if row.retain:
        retain_freed_memory()

    def run() -> float:
        if row.kind == "canonical":
            return run_canonical(images, spec["batch"], spec["z_dim"], spec["width"], spec["steps"], device=device)
        cfg = project_config(
            row.size,
            channels,
            spec["batch"],
            spec["z_dim"],
            spec["width"],
            spec["steps"],
            Precision(row.precision),
            row.compile,
            device,
            row.channels_last,
            row.dcgan_d,
        )
        return run_project(images, cfg)

    if torch.device(device).type == "cuda":  # the GPU's peak: what limits the batch size there
        speed = run()
        memory = torch.cuda.max_memory_allocated(device) / 2**20
        return {"value": speed if spec["measure"] == "speed" else memory, "gpu_mb": memory}
    if spec["measure"] == "speed":
        return {"value": run()}
    return {"value": peak_rss_growth_mb(run)}


def peak_rss_growth_mb(run: Callable[[], float]) -> float:
    """Peak RSS growth over the RSS just before `run`, sampled every millisecond.

    (The process's own high-water mark, ru_maxrss, is set by importing torch and TensorBoard,
    which is more than a small model's training ever adds, so it cannot tell two loops apart.)
    """
    baseline = peak = _current_rss_mb()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.001):
            peak = max(peak, _current_rss_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    run()
    done.set()
    sampler.join()
    return peak - baseline


def _current_rss_mb() -> float:
    """Resident memory now (Linux's /proc/self/statm; elsewhere the process's high-water mark)."""
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def interleaved(runners: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Run each runner once per round, alternating; median img/s per runner."""
    rates: dict[str, list[float]] = {name: [] for name in runners}
    for round_index in range(rounds):
        for name, runner in runners.items():
            rates[name].append(runner())
            log.info("round %d  %-28s %8.1f img/s", round_index, name, rates[name][-1])
    return {name: statistics.median(values) for name, values in rates.items()}


def refuse_bad_numbers(parser: argparse.ArgumentParser, counts: list[int], sizes: list[int]) -> None:
    """Before any work: counts of at least 1, and image sizes the models take (powers of two from 16)."""
    if min(counts) < 1 or any(s < 16 or s & (s - 1) for s in sizes):
        parser.error("--steps, --rounds, --width and --batch take numbers >= 1, --sizes powers of two >= 16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--batch", type=int, nargs="+", default=[128], help="batch sizes (each a set of rows)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--steps", type=int, default=15, help="iterations per round and side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "fp16"], choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--compile", action="store_true", help="also time bf16 with trainer.compile=true")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="auto", help="cpu | cuda | auto (cuda where available)")
    parser.add_argument("--nchw", action="store_true", help="also time bf16 without channels_last")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    args = parser.parse_args()
    refuse_bad_numbers(parser, [args.steps, args.rounds, args.width, *args.batch], args.sizes)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("gan.training").setLevel(logging.WARNING)
    logging.getLogger("gan.training.monitor").setLevel(logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.probe:
        print(json.dumps(run_probe(json.loads(args.probe))))
        return

    device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    on_gpu = torch.device(device).type == "cuda"
    z_dim, width = 100, args.width
    # the ceilings the rows need alone: bf16 on a CPU held to AVX2 (ATEN_CPU_CAPABILITY) is emulated and takes minutes
    needed = {"fp32"} | {"fp32" if precision == "fp32" else "bf16" for precision in args.precisions}
    peaks = {dtype: compute_ceiling(getattr(torch, PEAK_DTYPES[dtype]), device=device) for dtype in sorted(needed)}
    log.info("compute ceiling: %s", ", ".join(f"{dtype} {peak / 1e9:.0f} GFLOP/s" for dtype, peak in peaks.items()))
    rows = []
    for size, batch in ((size, batch) for size in args.sizes for batch in args.batch):
        channels = channels_for(size)
        table = [Row("canonical", size)] + ([] if on_gpu else [Row("canonical", size, retain=True)])
        table += [Row("project", size, precision) for precision in args.precisions]
        # train.py's default recipe (spectrally normalised D, adaptive DiffAugment, EMA): the whole loop a user runs
        table += [Row("project", size, precision, dcgan_d=False) for precision in args.precisions]
        if args.nchw:
            table.append(Row("project", size, "bf16", channels_last=False))
        if args.compile:
            table.append(Row("project", size, "bf16", compile=True))
        gpu_mb: dict[str, float] = {}

        def speed(row: Row, batch: int = batch, gpu_mb: dict = gpu_mb) -> float:
            result = probe_result(row, "speed", batch, z_dim, width, args.steps, device)
            gpu_mb[row.name] = max(gpu_mb.get(row.name, 0.0), result.get("gpu_mb", 0.0))
            return result["value"]

        rates = interleaved({row.name: functools.partial(speed, row) for row in table}, args.rounds)
        flops_of = {None: flops_per_step(size, channels, batch, z_dim, width)}  # each loop's own FLOPs per step
        for dcgan_d in (True, False):  # the same in every precision and layout
            cfg = project_config(size, channels, batch, z_dim, width, 1, Precision.fp32, dcgan_d=dcgan_d)
            flops_of[dcgan_d] = flops_per_step(size, channels, batch, z_dim, width, cfg)
        for row in table:
            rate, flops = rates[row.name], flops_of[None if row.kind == "canonical" else row.dcgan_d]
            if on_gpu:
                memory = gpu_mb[row.name]
            elif args.no_memory or row.compile:
                memory = None
            else:
                memory = probe(row, "memory", batch, z_dim, width, args.steps, device)
            achieved = flops * rate / batch
            fraction = achieved / peaks["fp32" if row.precision == "fp32" else "bf16"]
            rows.append((size, batch, row.name, rate, rate / rates[table[0].name], memory, flops, achieved, fraction))
    print_table(rows, device)


PEAK_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # fp16 rows are set against the bf16 peak


def print_table(rows: list[tuple], device: str = "cpu") -> None:
    memory_kind = "GPU MB" if torch.device(device).type == "cuda" else "peak MB"
    header = (
        f"{'px':>3} {'batch':>5}  {'loop':<30} {'img/s':>9} {'vs canon':>8} {memory_kind:>14} "
        f"{'GFLOP/step':>10} {'GFLOP/s':>8} {'of peak':>7}"
    )
    print(header)
    print("-" * len(header))
    canonical_memory = {}
    for size, batch, name, rate, ratio, memory, flops, achieved, fraction in rows:
        if name == "canonical fp32":
            canonical_memory[size, batch] = memory
        memory_text = "-" if memory is None else f"{memory:.0f}"
        if memory is not None and canonical_memory.get((size, batch)) and name != "canonical fp32":
            memory_text += f" ({memory / canonical_memory[size, batch]:.2f}x)"
        print(
            f"{size:>3} {batch:>5}  {name:<30} {rate:>9.1f} {ratio:>7.2f}x {memory_text:>14} {flops / 1e9:>10.1f} "
            f"{achieved / 1e9:>8.0f} {fraction:>6.0%}"
        )
    if torch.device(device).type == "cuda":
        where = f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}"
    else:
        where = f"{torch.get_num_threads()} torch threads"
    print(f"\nmachine: {where}; torch {torch.__version__}")


if __name__ == "__main__":
    main()
