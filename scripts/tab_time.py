"""How long a TAB of bash completion and `--help` take, per program, beside `import torch` alone.

    python scripts/tab_time.py [--rounds 5]

Each row is the median wall time of fresh processes, run in turns so that a busy machine slows all rows
alike. A TAB runs the program with `-sc query=bash` (Hydra's completion query, COMP_LINE set as bash
sets it); the programs import torch only inside their job, so neither of these columns should approach
the torch row.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("train.py", "evaluate.py", "generate.py")


def seconds(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    cases = {"import torch": ([sys.executable, "-c", "import torch"], dict(os.environ))}
    for program in PROGRAMS:  # bash sets COMP_LINE to the line typed so far: here `python PROGRAM lo<TAB>`
        typed = {**os.environ, "COMP_LINE": f"python {program} lo"}
        cases[f"{program} TAB"] = ([sys.executable, program, "-sc", "query=bash"], typed)
        cases[f"{program} --help"] = ([sys.executable, program, "--help"], dict(os.environ))
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (argv, env) in cases.items():
            times[name].append(seconds(argv, env))
    print(f"| command | median s ({rounds} rounds) |\n|---|--:|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
