"""Where the default step's time goes: each part's share, per precision and image size.

    python scripts/bench_parts.py                              # 32 and 64 px, fp32 and bf16, 1 thread
    python scripts/bench_parts.py --sizes 64 --precisions fp32 --rounds 5
    ONEDNN_MAX_CPU_ISA=AVX2 python scripts/bench_parts.py      # oneDNN limited to AVX2 (a CPU without AVX-512)
    python scripts/bench_parts.py --ratio --profile --sizes 64 --width 64 --batch 128
        # the default step against the canonical one, and the most any change outside the convolutions
        # could give: the ratio if the step's time were its convolutions' alone (torch.profiler)

The step is train.py's (gan/training/loop.py): G's forward, the D step, the G step, the EMA update,
with the default model (spectrally normalised D, adaptive DiffAugment, EMA) at data.batch_size and the
model widths of the defaults, 1 channel at 32 px and 3 at 64 px. A part's cost is the step time with it
less the step time without it (spectral norm off; augmentation off against ADA at p = 0 and at p > 0;
the EMA off, or every 4 steps; NCHW against channels_last), every variant timed in turn, round after
round, in one process; the median round is reported. Time is the process's CPU time
(time.process_time), not the wall clock: with one thread it is the step's own work, which other
processes on the machine change far less than the wall time (they still share caches and memory
bandwidth). The allocator setting of every training run (trainer.retain_host_memory) is on. The
periodic extras (logging, sample grids, checkpoints, D's overfitting probe, ...) are timed inside a
real train() run with every cadence set to a few steps, and each call's mean cost (the first call, a
warm-up, left out) is divided by its default cadence. A program, not part of
the library.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repo's gan and scripts

from gan.config import DataConfig, ModelConfig, Precision, TrainConfig, TrainerConfig  # noqa: E402
from gan.core.models import Discriminator, Generator  # noqa: E402
from gan.device import retain_freed_memory  # noqa: E402
from gan.training import loop, train  # noqa: E402
from scripts.bench import SigmoidD, canonical_step, project_step, refuse_bad_numbers  # noqa: E402

log = logging.getLogger(__name__)

# variant name -> (model overrides, trainer overrides, ADA's p held fixed; None: no ADA)
VARIANTS: dict[str, tuple[dict, dict, float | None]] = {
    "default (ADA at p = 0)": ({}, {}, 0.0),
    "no spectral norm": ({"spectral_norm": False}, {}, 0.0),
    "no augmentation": ({"diffaugment": []}, {}, None),
    "ADA at p = 0.25": ({}, {}, 0.25),
    "no EMA": ({"ema_decay": 0.0}, {}, 0.0),
    "EMA every 4 steps": ({"ema_every": 4}, {}, 0.0),
    "NCHW (channels_last off)": ({}, {"channels_last": False}, 0.0),
    "canonical fp32 step": ({}, {}, None),  # pytorch/examples' step (scripts/bench.py), DCGAN's D, same widths
}
# a part's cost: (variant with it, variant without it); positive: the part costs time
PARTS = {
    "spectral norm (power iteration)": ("default (ADA at p = 0)", "no spectral norm"),
    "augmentation at p = 0": ("default (ADA at p = 0)", "no augmentation"),
    "augmentation at p = 0.25": ("ADA at p = 0.25", "no augmentation"),
    "EMA update, every step": ("default (ADA at p = 0)", "no EMA"),
    "EMA update, every 4 steps": ("EMA every 4 steps", "no EMA"),
    "channels_last (negative: faster)": ("default (ADA at p = 0)", "NCHW (channels_last off)"),
}


def config(
    size: int, precision: str, model: dict | None = None, trainer: dict | None = None, batch: int = 64, width: int = 32
) -> TrainConfig:
    channels = 1 if size <= 32 else 3
    cfg = TrainConfig(
        data=DataConfig(image_size=size, channels=channels, num_samples=2048, batch_size=batch),
        trainer=TrainerConfig(precision=Precision(precision), threads=torch.get_num_threads(), progress=False),
    )
    cfg.model = dataclasses.replace(ModelConfig(), g_width=width, d_width=width, **(model or {}))
    cfg.trainer = dataclasses.replace(cfg.trainer, **(trainer or {}))
    return cfg


def canonical(cfg: TrainConfig) -> Callable[[], None]:
    """pytorch/examples' fp32 step on the same G, DCGAN's D (BatchNorm, Sigmoid), widths and batch."""
    channels, size, width = cfg.data.channels, cfg.data.image_size, cfg.model.g_width
    netG = Generator(cfg.model.z_dim, width, channels, size)
    netD = SigmoidD(Discriminator(width, channels, size))
    opt_g, opt_d = (torch.optim.Adam(net.parameters(), lr=2e-4, betas=(0.5, 0.999)) for net in (netG, netD))
    real = torch.rand(cfg.data.batch_size, channels, size, size) * 2 - 1
    return lambda: canonical_step(netG, netD, opt_g, opt_d, real, torch.randn(real.size(0), cfg.model.z_dim, 1, 1))


def step_times(
    size: int, precision: str, steps: int, rounds: int, names: list[str], batch: int, width: int
) -> dict[str, float]:
    """Median CPU seconds per step of each variant named, rounds interleaved."""
    steppers = {}
    for name in names:
        model, trainer, p = VARIANTS[name]
        cfg = config(size, precision, model, trainer, batch, width)
        steppers[name] = canonical(cfg) if name == "canonical fp32 step" else project_step(cfg, p)
    for step in steppers.values():  # warm-up: oneDNN builds its kernels on first use
        step()
    times: dict[str, list[float]] = {name: [] for name in steppers}
    for index in range(rounds):
        for name, step in steppers.items():
            start = time.process_time()
            for _ in range(steps):
                step()
            times[name].append((time.process_time() - start) / steps)
        log.info("round %d: %s", index, {name: f"{t[-1] * 1e3:.1f} ms" for name, t in times.items()})
    return {name: statistics.median(t) for name, t in times.items()}


def extras_costs(
    size: int, precision: str, batch: int, width: int, every: int = 5, steps: int = 30
) -> dict[str, float]:
    """Mean seconds per call of each periodic extra of a real train() run, every cadence set to `every`."""
    calls: dict[str, list[float]] = {}
    original = loop.Extras.__init__

    def timed_init(self: loop.Extras, tasks) -> None:
        def timed(task: loop.Every) -> loop.Every:
            def run(tick: loop.Tick) -> None:
                start = time.process_time()
                task.run(tick)
                calls.setdefault(task.name, []).append(time.process_time() - start)

            return dataclasses.replace(task, run=run)

        original(self, [timed(task) for task in tasks])

    cadences = {key: every for key in ("log_every", "sample_every", "checkpoint_every", "overfit_every")}
    cfg = config(size, precision, None, {"max_steps": steps, "d_won_window": every, **cadences}, batch, width)
    loop.Extras.__init__ = timed_init
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            train(cfg, Path(run_dir))
    finally:
        loop.Extras.__init__ = original
    return {name: statistics.mean(values[1:] or values) for name, values in calls.items()}  # the first: warm-up


DEFAULT_CADENCE = {  # the extras' names in loop.periodic_extras -> TrainerConfig's default steps between calls
    "log": TrainerConfig.log_every,
    "sample": TrainerConfig.sample_every,
    "checkpoint": TrainerConfig.checkpoint_every,
    "overfitting": TrainerConfig.overfit_every,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--steps", type=int, default=10, help="steps per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steady beside other work)")
    parser.add_argument("--batch", type=int, default=64, help="data.batch_size (the default's)")
    parser.add_argument("--width", type=int, default=32, help="model.g_width and d_width (the default's)")
    parser.add_argument("--ratio", action="store_true", help="only the default step against the canonical one")
    parser.add_argument("--profile", action="store_true", help="also the convolutions' share (torch.profiler)")
    args = parser.parse_args()
    refuse_bad_numbers(parser, [args.steps, args.rounds, args.width, args.batch], args.sizes)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in ("gan", "gan.training", "gan.training.monitor", "gan.data.sources"):
        logging.getLogger(name).setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    retain_freed_memory()  # as train.py does by default (trainer.retain_host_memory)
    columns = [(size, precision) for size in args.sizes for precision in args.precisions]
    shares: dict[str, dict[tuple[int, str], str]] = {}
    step_ms: dict[tuple[int, str], float] = {}
    names = ["default (ADA at p = 0)", "canonical fp32 step"] if args.ratio else list(VARIANTS)
    for column in columns:
        times = step_times(*column, args.steps, args.rounds, names, args.batch, args.width)
        base = times["default (ADA at p = 0)"]
        step_ms[column] = base * 1e3
        ratio = times["canonical fp32 step"] / base
        shares.setdefault("canonical fp32 step: its time / the default step's", {})[column] = f"{ratio:.2f}x"
        if args.profile:  # what no change outside the convolutions can beat: the step with only them left
            share = conv_share(project_step(config(*column, batch=args.batch, width=args.width), 0.0), args.steps)
            shares.setdefault("convolutions' share of the default step (torch.profiler, self time)", {})[column] = (
                f"{share:.1%}"
            )
            bound = shares.setdefault("the default step with nothing but its convolutions, vs canonical", {})
            bound[column] = f"{ratio / share:.2f}x"
        if args.ratio:
            continue
        for part, (with_it, without) in PARTS.items():
            cost = times[with_it] - times[without]
            shares.setdefault(part, {})[column] = f"{cost * 1e3:+.2f} ms ({cost / base:+.1%})"
        for name, seconds in extras_costs(*column, args.batch, args.width).items():
            cadence = DEFAULT_CADENCE.get(name, 1)
            per_step = seconds / cadence
            label = f"{name} (every {cadence} steps)" if cadence > 1 else f"{name} (every step)"
            shares.setdefault(label, {})[column] = f"{per_step * 1e3:.3f} ms ({per_step / base:.2%})"
    heads = [f"{size} px {precision}" for size, precision in columns]
    print("| part | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(columns))
    step_row = " | ".join(f"{step_ms[c]:.1f} ms" for c in columns)
    print(f"| default step (G forward, D step, G step, EMA) | {step_row} |")
    for part, row in shares.items():
        print(f"| {part} | " + " | ".join(row.get(c, "-") for c in columns) + " |")
    print(f"\nCPU time per step; {torch.get_num_threads()} torch thread(s); torch {torch.__version__}; {cpu_name()}")


def conv_share(step: Callable[[], None], steps: int) -> float:
    """The share of the step's self time (each op's own, its callees apart) spent in convolution ops,
    forward and backward: aten::mkldnn_convolution, aten::convolution_backward and their kin."""
    step()  # builds the kernels
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()
    return sum(e.self_cpu_time_total for e in events if "conv" in e.key) / sum(e.self_cpu_time_total for e in events)


def cpu_name() -> str:
    """The CPU's model and its bf16-related flags, from /proc/cpuinfo (Linux)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "CPU unknown"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    wanted = [flag for flag in flags if flag in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")]
    return f"{model} ({', '.join(wanted) or 'no AVX2'})"


if __name__ == "__main__":
    main()
