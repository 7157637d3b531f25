"""Speed on a shared machine: the default training run alone, then beside busy processes, under
thread-count and OpenMP wait-policy choices. Prints a table of seconds per step.

    python scripts/bench_contention.py                     # every case below
    python scripts/bench_contention.py --seconds 60 --neighbours 1 2

Each case runs the measured run (train() with the defaults and the overrides given, in a fresh
process) while `neighbours` other processes train without end, started first and killed after. The
measured run's clock starts --settle-s seconds after its first step (kernels built, neighbours
going, and trainer.adapt_threads' governor, which waits 10 s and then two 2 s windows, settled) and
stops after --steps more steps or --seconds, whichever comes first. A fair share of C cores among P
busy processes is C / P each: a run that keeps T cores busy alone should take at most
max(1, T x P / C) times its alone time beside the others ("x fair share" divides by that); above 1
is time lost to the contention itself.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repo's gan and scripts

log = logging.getLogger("bench_contention")

# (name, threads of the measured run, of each neighbour, extra environment of every process); threads:
# a trainer.threads count, or "adapt" for trainer.adapt_threads=true
CASES = [
    ("the default (threads=0: torch's count, fixed), neighbours the same", "0", "0", {}),
    ("adapt_threads=true, neighbours the same", "adapt", "adapt", {}),
    ("adapt_threads=true beside neighbours at the default", "adapt", "0", {}),
    ("threads=2, OMP_WAIT_POLICY=PASSIVE", "2", "2", {"OMP_WAIT_POLICY": "PASSIVE"}),
    ("threads=1", "1", "1", {}),
]


def thread_overrides(threads: str) -> list[str]:
    return ["trainer.threads=0", "trainer.adapt_threads=true"] if threads == "adapt" else [f"trainer.threads={threads}"]


def worker(args: argparse.Namespace) -> None:
    """One training process: timed steps after --settle-s (or forever, as a neighbour)."""
    from gan.training import train
    from scripts.compare import train_config

    # no log point in the timed steps, so no D-won alarm either (it reads D's outputs at log points)
    cfg = train_config(args.overrides + ["trainer.progress=false", "trainer.max_steps=1000000000",
                                         *thread_overrides(args.threads), "trainer.log_every=100000",
                                         "trainer.on_d_won=off"])  # fmt: skip
    first: list[float] = []
    marks: list[tuple[int, float]] = []

    def after_step(state) -> bool:
        now = time.perf_counter()
        if not first:
            first.append(now)
        if args.measure and not marks and now - first[0] >= args.settle_s:
            marks.append((state.step, now))
        if marks and (state.step - marks[0][0] >= args.steps or now - marks[0][1] >= args.seconds):
            marks.append((state.step, now))
            return True
        return False

    with tempfile.TemporaryDirectory() as run_dir:
        train(cfg, Path(run_dir), after_step=after_step)
    (step0, t0), (step1, t1) = marks[0], marks[-1]
    print(json.dumps({"sec_per_step": (t1 - t0) / (step1 - step0), "steps": step1 - step0}))


def measure(case: tuple, neighbours: int, args: argparse.Namespace) -> float:
    _, threads, their_threads, env = case
    environment = {**os.environ, **env}
    base = [sys.executable, __file__, "--worker", *args.overrides, "--settle-s", str(args.settle_s),
            "--steps", str(args.steps), "--seconds", str(args.seconds)]  # fmt: skip
    quiet = subprocess.DEVNULL
    others = [subprocess.Popen([*base, "--threads", their_threads], env=environment, stdout=quiet, stderr=quiet)
              for _ in range(neighbours)]  # fmt: skip
    try:
        time.sleep(8 if neighbours else 0)  # the neighbours past their start-up
        argv = [*base, "--threads", threads, "--measure"]
        done = subprocess.run(argv, env=environment, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-2000:])
        return json.loads(done.stdout.strip().splitlines()[-1])["sec_per_step"]
    finally:
        for other in others:
            other.kill()
            other.wait()


def main(args: argparse.Namespace) -> None:
    cores = len(os.sched_getaffinity(0))
    rows = []
    for case in CASES:
        name, threads = case[0], case[1]
        alone = None
        for neighbours in [0, *args.neighbours]:
            seconds = statistics.median(measure(case, neighbours, args) for _ in range(args.rounds))
            alone = seconds if neighbours == 0 else alone
            used = min(int(threads) if threads.isdigit() and threads != "0" else cores, cores)  # busy alone
            fair = alone * max(1.0, used * (1 + neighbours) / cores)  # each process's share: cores / (1 + neighbours)
            rows.append((name, neighbours, seconds, seconds / alone, seconds / fair))
            log.info("%s, %d neighbour(s): %.3f s/step", name, neighbours, seconds)
    print(f"{cores} cores; timed: {args.steps} steps or {args.seconds:.0f} s after {args.settle_s:.0f} s; "
          f"median of {args.rounds}; overrides: {' '.join(args.overrides) or '(none)'}")  # fmt: skip
    print("| case | busy neighbours | s/step | x alone | x fair share |")
    print("|---|--:|--:|--:|--:|")
    for name, neighbours, seconds, vs_alone, vs_fair in rows:
        print(f"| {name} | {neighbours} | {seconds:.3f} | {vs_alone:.2f} | {vs_fair:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="train.py overrides of every process")
    parser.add_argument("--steps", type=int, default=1000, help="timed steps of the measured run, at most")
    parser.add_argument("--seconds", type=float, default=20.0, help="timed seconds of the measured run, at most")
    parser.add_argument("--settle-s", type=float, default=16.0, help="seconds after the first step before the clock")
    parser.add_argument("--neighbours", type=int, nargs="+", default=[1], help="busy neighbour counts to try")
    parser.add_argument("--rounds", type=int, default=1, help="repeats of each case (the median is shown)")
    parser.add_argument("--threads", default="0", help=argparse.SUPPRESS)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING if arguments.worker else logging.INFO, format="%(message)s")
    worker(arguments) if arguments.worker else main(arguments)
