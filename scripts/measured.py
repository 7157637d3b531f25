"""The measured numbers README.md states, each recorded from the file that holds it.

    python scripts/measured.py run RUN_DIR --eval EVAL_DIR --name digits_default --command "make train" --quiet
        a training run: its time from RUN_DIR/train.log (first log line to the "Done" line), its
        quality from EVAL_DIR/metrics.json (what `python evaluate.py checkpoint=RUN_DIR
        hydra.run.dir=EVAL_DIR` writes; RUN_DIR/eval if not given)
    python scripts/measured.py tests LOG --name fast_tier --command "make test" --quiet
        a test tier: pytest's summary line at the end of LOG ("790 passed, ... in 113.20s (0:01:53)")
    python scripts/measured.py minute LOG --name one_minute --command "python scripts/one_minute.py" --quiet
        the last line scripts/one_minute.py printed ("one_minute steps=N seconds=S fid=F classes=C recall=R");
        with --gpu "NVIDIA H200", a log brought back from a GPU machine (scripts/gpu_check.sh)
    python scripts/measured.py show
        prints each entry as README.md states it, and README's results table

Each entry goes into docs/results/measured.json with the CPU it ran on (model name, and whether it
has fast bf16: AVX512-bf16 or AMX), whether the machine was quiet (`--quiet`: nothing else ran; say
it only when true) and the date; `--limited-to AVX2` records a run made with ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 and trainer.precision=fp32, this CPU standing in for one without AVX-512 or fast bf16.
tests/test_docs.py checks that README.md states each `--prose` entry exactly as `phrases` renders it
and holds the results `table`, so a README number cannot drift from its file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "docs" / "results" / "measured.json"
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")
DONE = re.compile(r"Done: (\d+) steps")
SUMMARY = re.compile(r"(?P<counts>\d+ passed[^=]*?) in (?P<seconds>[0-9.]+)s")


def cpu(limited_to: str = "") -> dict:
    """The CPU's model name and whether it has fast bf16 (what trainer.precision=auto looks for). `limited_to`: the
    instruction set the run was held to (ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA), standing in for a CPU
    without fast bf16 (the run then trains in fp32)."""
    if limited_to:
        return {**cpu(), "limited_to": limited_to, "fast_bf16": False}
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": platform.processor() or platform.machine(), "fast_bf16": None}
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = set(re.search(r"^flags\s*:\s*(.+)$", info, re.M).group(1).split())
    return {
        "model": model.group(1).strip() if model else "unknown",
        "fast_bf16": bool(flags & {"avx512_bf16", "amx_bf16"}),
    }


def from_run(run_dir: Path, eval_dir: Optional[Path] = None) -> dict:
    """Steps and training seconds from train.log, quality from evaluate.py's metrics.json in `eval_dir`."""
    times, steps = [], None
    for line in (run_dir / "train.log").read_text().splitlines():
        if match := LOG_TIME.match(line):
            stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
            times.append(stamp + datetime.timedelta(milliseconds=int(match.group(2))))
        if done := DONE.search(line):
            steps, end = int(done.group(1)), times[-1]
    if steps is None:
        raise SystemExit(f"{run_dir / 'train.log'} has no 'Done: N steps' line: the run did not finish")
    metrics = json.loads(((eval_dir or run_dir / "eval") / "metrics.json").read_text())
    return {
        "kind": "run",
        "steps": steps,
        "seconds": round((end - times[0]).total_seconds(), 1),
        **{key: round(metrics[key], 4) for key in ("fid", "precision", "recall")},
        "classes": metrics["classes_covered"],
        "samples": metrics["num_samples"],
    }


def from_tests(log: Path) -> dict:
    lines = [line for line in log.read_text().splitlines() if SUMMARY.search(line)]
    if not lines:
        raise SystemExit(f"{log} has no pytest summary line ('N passed ... in S s')")
    match = SUMMARY.search(lines[-1])
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", match.group("counts"))}
    return {"kind": "tests", **counts, "seconds": round(float(match.group("seconds")), 1)}


def from_minute(log: Path) -> dict:
    lines = [line for line in log.read_text().splitlines() if line.startswith("one_minute ")]
    if not lines:
        raise SystemExit(f"{log} has no 'one_minute steps=...' line: scripts/one_minute.py did not finish")
    values = dict(field.split("=") for field in lines[-1].split()[1:])
    numbers = {"steps": int(values["steps"]), "seconds": float(values["seconds"]), "fid": float(values["fid"])}
    return {"kind": "minute", **numbers, "classes": int(values["classes"]), "recall": float(values["recall"])}


def duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def phrases(entry: dict) -> list[str]:
    """How README.md states an entry: each string must appear in it word for word."""
    machine = machine_of(entry)
    if entry["kind"] == "run":
        return [
            f"{entry['steps']:,} steps" + (f" in {duration(entry['seconds'])}" if entry["quiet"] else ""),
            f"FID {entry['fid']:.2f}",
            f"precision {entry['precision']:.2f}",
            f"recall {entry['recall']:.2f}",
            f"{entry['classes']} of 10 classes",
            machine,
        ]
    if entry["kind"] == "minute":
        return [f"{entry['steps']:,} steps in {duration(entry['seconds'])}, FID {entry['fid']:.2f}", machine]
    return [f"{entry['passed']:,} passed in {duration(entry['seconds'])}", machine]


def machine_of(entry: dict) -> str:
    """'on 2 quiet cores of an AMD EPYC with fast bf16', or for a log made on a lent GPU machine 'on an NVIDIA H200'."""
    if entry.get("gpu"):
        return f"on an {entry['gpu']}" + ("" if entry["quiet"] else ", busy")
    held = entry["cpu"].get("limited_to")
    kind = f"held to {held}" if held else ("with" if entry["cpu"]["fast_bf16"] else "without") + " fast bf16"
    load = "quiet" if entry["quiet"] else "busy"
    return f"on {entry['cores']} {load} cores of an {entry['cpu']['model']} {kind}"


def table(entries: dict) -> str:
    """README's results table: one row per recorded training run."""
    rows = [
        "| run | command | steps | training time | FID | precision | recall | classes |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for entry in (e for e in entries.values() if e["kind"] == "run"):
        rows.append(
            f"| {entry['title']} | `{entry['command']}` | {entry['steps']:,} | {timed(entry)} | "
            f"{entry['fid']:.2f} | {entry['precision']:.2f} | {entry['recall']:.2f} | {entry['classes']} / 10 |"
        )
    return "\n".join(rows)


def timed(entry: dict) -> str:
    """A training time says something only when nothing else ran."""
    return duration(entry["seconds"]) if entry["quiet"] else "not timed (shared machine)"


def load() -> dict:
    return json.loads(MEASURED.read_text()) if MEASURED.exists() else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    for what in ("run", "tests", "minute"):
        command = sub.add_parser(what)
        command.add_argument("path", type=Path)
        command.add_argument("--name", required=True)
        command.add_argument("--command", required=True, help="the command that made it, as README gives it")
        command.add_argument("--quiet", action="store_true", help="nothing else ran on the machine")
        command.add_argument("--title", default="", help="a run's row name in README's results table")
        command.add_argument("--prose", action="store_true", help="README states it in a sentence, not only a row")
        command.add_argument("--eval", type=Path, help="a run's evaluation folder (hydra.run.dir of evaluate.py)")
        command.add_argument("--limited-to", default="", help="the instruction set the run was held to, e.g. AVX2")
        command.add_argument("--gpu", default="", help="the GPU it ran on, where the log came from another machine")
    sub.add_parser("show")
    args = parser.parse_args()
    entries = load()
    if args.what != "show":
        read = {"run": lambda: from_run(args.path, args.eval), "tests": lambda: from_tests(args.path)}
        entry = read.get(args.what, lambda: from_minute(args.path))()
        entry.update(command=args.command, quiet=args.quiet)
        if args.gpu:  # this machine's CPU and cores say nothing of that one's
            entry["gpu"] = args.gpu
        else:
            entry.update(cpu=cpu(args.limited_to), cores=os.cpu_count())
        entry["date"], entry["prose"] = datetime.date.today().isoformat(), args.prose
        if args.what == "run":
            entry["title"] = args.title or args.name
        entries[args.name] = entry
        MEASURED.write_text(json.dumps(entries, indent=1) + "\n")
    for name, entry in entries.items():
        print(f"{name} ({entry['command']}): " + "; ".join(phrases(entry)))
    print(table(entries))


if __name__ == "__main__":
    main()
