"""Adversarial probe of both entry points: hostile but realistic input, and how each is treated.

    .venv/bin/python scripts/probe.py                        # every case (about 20 minutes on 2 busy cores)
    .venv/bin/python scripts/probe.py --only resume          # the cases whose name or family holds 'resume'
    .venv/bin/python scripts/probe.py --work /tmp/probe      # keep the scratch area (reused by the next call)
    .venv/bin/python scripts/probe.py --list                 # the cases and what each expects
    .venv/bin/python scripts/probe.py --jobs 2               # two cases at a time, each in its own copy

It first trains a few real runs (`debug=tiny trainer.threads=1`, six CPU steps each) into its own
scratch area, one of them a sweep (`-m`), and keeps a pristine copy of them: the "existing runs"
(A, B, SPACE, EQ, BEST, INTERP, the sweep's SW0 and SW1 and the sweep folder SWEEP). Then every case
runs `train.py` or `evaluate.py` as a subprocess (cwd = the scratch area, run and sweep dirs inside
it, so nothing lands in the repo's outputs/), with a timeout. Before and after each command every
file of every existing run is hashed (sha256, plus the set of names; `.lock` files aside) and the
step in each checkpoint read; the pristine runs are restored before each case, so cases are
independent. A case is one or more commands (steps), each with its expectation stated: the exit
code, the substrings its output must hold (the key or path at fault; `a|b` accepts either), those it
must not hold, the runs it may legitimately change, files that must stay byte-identical even so, and
an optional check of what it left (a resumed run's step). Where two outcomes are both correct (a
clamp with a warning, or a refusal) a step lists both. Each step, and the case (its worst step), is:

    lost        an existing run's file changed, appeared or vanished, or its step changed, where the
                step may not touch that run; or a follow-up plain resume (the documented rescue
                after a refused one) no longer works
    traceback   'Traceback' in the output, or death by a signal (negative exit code, or a timeout)
    silent      exit 0 where a refusal was expected, or a success without its expected effect or
                warning text
    misleading  refused, but with another exit code or without the required substrings, or with a
                forbidden one ('Nothing was written' when something was); a printed command that
                does not work when pasted into a shell
    clear       the expected exit code and substrings

Prints a table (case, family, exit code, class, the first 160 characters of the message), the
reasons of every case that was not clear, and one line:
    probe tried=N clear=A misleading=B tracebacks=C silent=D lost=E
Exit code 0 when every case was clear, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import pickle
import random
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "train.py"
EVALUATE = ROOT / "evaluate.py"
BIG = 1099511627776  # 2**40: fits an int64, not a C int
NONFINITE = "nan|non-finite|infinite|inf"
CLASSES = ("lost", "traceback", "silent", "misleading", "clear")  # worst first
PROBE_ERROR = "probe-error"  # a case this probe could not run (its own bug): outside the counts of the tool
log = logging.getLogger("probe")


def worst(*classes: str) -> str:
    return min(classes, key=CLASSES.index)


# The existing runs -------------------------------------------------------------------------------
# name -> (path under outputs/, how it was made). Made once per probe with `debug=tiny trainer.threads=1`.
RUNS: dict[str, str] = {
    "A": "runs/a",
    "B": "runs/b",
    "SPACE": "runs/my run",
    "EQ": "runs/lr=1e-3",
    "BEST": "runs/best",
    "INTERP": "runs/interp_7",
    "SWEEP": "sweep",  # the sweep folder's own files (multirun.yaml); its jobs are SW0 and SW1
    "SW0": "sweep/0_optim.lr=0.002",
    "SW1": "sweep/1_optim.lr=0.003",
}
SHALLOW = {"SWEEP"}  # runs whose snapshot holds only the files directly inside
MAKE_RUNS: list[tuple[bool, tuple[str, ...]]] = [  # (multirun, overrides)
    (False, ("hydra.run.dir=<outputs>/runs/a",)),
    (False, ("loss=hinge", "hydra.run.dir=<outputs>/runs/b")),
    (False, ("trainer.seed=3", "hydra.run.dir=<q:outputs_space>")),
    (False, ("trainer.seed=4", "hydra.run.dir=<q:outputs_eq>")),
    (False, ("trainer.seed=5", "trainer.eval_every=3", "trainer.eval_samples=32", "hydra.run.dir=<outputs>/runs/best")),
    (False, ("trainer.seed=7", "hydra.run.dir=<outputs>/runs/interp_${trainer.seed}")),
    (True, ("optim.lr=0.002,0.003", "hydra.sweep.dir=<outputs>/sweep")),
]


# What a command did ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    code: Optional[int]  # None: still running when killed after the timeout
    out: str  # stdout then stderr
    seconds: float
    note: str = ""


@dataclass
class RunState:
    files: dict[str, str]  # relative path -> sha256
    steps: dict[str, Any]  # relative path of each last.pt/best.pt -> its step (or 'unreadable')


class ArgvError(Exception):
    """A command could not be built from what the previous step printed (a missing resume line)."""


@dataclass
class Ctx:
    """One worker's scratch area and the state of the case it runs."""

    work: Path  # the cwd of every command; holds outputs/ (the existing runs), new/, live/, logs/
    pristine: Path  # the pristine outputs/ to restore
    case: str = ""
    bg: Optional[tuple[subprocess.Popen, Path, Path]] = None  # a background command and its output files
    last: Optional[Outcome] = None  # the previous step's outcome
    memo: dict[str, Any] = field(default_factory=dict)  # what a step's command left for its check

    @property
    def outputs(self) -> Path:
        return self.work / "outputs"

    def paths(self) -> dict[str, Path]:
        named = {name: self.outputs / rel for name, rel in RUNS.items()}
        return {
            **named,
            "work": self.work,
            "outputs": self.outputs,
            "outputs_space": self.outputs / "runs" / "my run",
            "outputs_eq": self.outputs / "runs" / "lr=1e-3",
            "new": self.work / "new" / self.case,  # a fresh run dir for this case
            "live": self.work / "live" / f"{self.case} run",  # a background run's dir (a space in it)
            "live_eq": self.work / "live" / f"{self.case} run lr=1e-3",  # ... and an '=' too
            "scratch": self.work / "scratch" / self.case,  # this case's own files (datasets, links)
        }

    def sub(self, text: str) -> str:
        """'<A>' -> the path of run A; '<q:A>' -> that path quoted for Hydra's override grammar."""
        paths = self.paths()

        def one(match: re.Match) -> str:
            path = str(paths[match.group(2)])
            return hydra_quote(path) if match.group(1) else path

        return re.sub(r"<(q:)?([A-Za-z][A-Za-z0-9_]*)>", one, text)

    def path(self, text: str) -> Path:
        return Path(self.sub(text))


def hydra_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# Expectations ---------------------------------------------------------------------------------------

Check = Callable[[Ctx, Outcome], Optional[str]]  # a problem, or None
Argv = Callable[[Ctx], list[str]]


@dataclass
class Expect:
    code: int
    required: tuple[str, ...] = ()  # each must appear (case-insensitive); 'a|b': either; '<A>': a path
    forbidden: tuple[str, ...] = ()
    may_change: tuple[str, ...] = ()  # existing runs this outcome may legitimately change
    check: Optional[Check] = None  # what the command must have left behind


@dataclass
class Step:
    argv: Argv
    expect: tuple[Expect, ...] = ()  # the first is the main one; an outcome is judged by those of its exit code
    keep: tuple[str, ...] = ()  # files that must stay byte-identical even in a run that may change
    fail_as: Optional[str] = None  # the class of any failure of this step ('lost' for a rescue resume)
    background: bool = False  # start it and leave it running once `ready`; a later step signals it
    ready: Optional[Callable[[Ctx, str], bool]] = None  # when to signal (interrupt) or go on (background)
    interrupt: Optional[signal.Signals] = None  # sent to the process group once `ready`
    stop_background: Optional[signal.Signals] = None  # sent to the background command; this step is its end
    limit_file_size: Optional[int] = None  # RLIMIT_FSIZE of the command, in bytes
    timeout: float = 300


@dataclass
class Case:
    name: str
    family: str
    steps: list[Step]
    setup: Optional[Callable[[Ctx], None]] = None  # after the pristine runs are restored
    unsure: str = ""  # why its expectation may be debatable


@dataclass
class Verdict:
    cls: str
    code: Optional[int]
    message: str
    reasons: list[str]


# Commands --------------------------------------------------------------------------------------------


def _keys(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0].lstrip("+~") for a in args if "=" in a}


def train(*args: str, multirun: bool = False) -> Argv:
    """`python train.py [-m] debug=tiny ARGS trainer.threads=1`, with a fresh run (or sweep) dir under
    new/ unless ARGS name one or resume."""

    def build(ctx: Ctx) -> list[str]:
        items = [ctx.sub(a) for a in args]
        keys = _keys(items)
        if "debug" not in keys:
            items.insert(0, "debug=tiny")
        if "trainer.threads" not in keys:
            items.append("trainer.threads=1")
        if multirun and "hydra.sweep.dir" not in keys:
            items.append(ctx.sub("hydra.sweep.dir=<new>"))
        if not multirun and not (keys & {"hydra.run.dir", "trainer.resume"}):
            items.append(ctx.sub("hydra.run.dir=<new>"))
        return [sys.executable, str(TRAIN), *(["-m"] if multirun else []), *items]

    return build


# evaluate.py kept short: the damaged cases should refuse before any of it matters
EVAL_FAST = (
    "num_samples=64",
    "metrics.classifier.min_accuracy=0",
    "bn_batches=2",
    "grid_samples=16",
    "interpolation_rows=2",
    "neighbour_queries=2",
    "metrics.kid_subsets=2",
    "metrics.kid_subset_size=32",
)


def evaluate(*args: str, fast: bool = True) -> Argv:
    """`python evaluate.py ARGS threads=1` into a fresh dir under new/ unless ARGS name one."""

    def build(ctx: Ctx) -> list[str]:
        items = [ctx.sub(a) for a in args]
        keys = _keys(items)
        if fast:
            items = [a for a in EVAL_FAST if a.split("=", 1)[0] not in keys] + items
        if "threads" not in keys:
            items.append("threads=1")
        if "hydra.run.dir" not in keys:
            items.append(ctx.sub("hydra.run.dir=<new>"))
        return [sys.executable, str(EVALUATE), *items]

    return build


def resume_line(out: str) -> str:
    """The command printed after 'Resume with:' (on the same line or the next)."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if "Resume with:" in line:
            rest = line.split("Resume with:", 1)[1].strip()
            if rest:
                return rest
            following = [x for x in lines[i + 1 :] if x.strip()]
            if following:
                return following[0].strip()
    raise ArgvError("no 'Resume with:' line was printed")


def pasted_resume(name: str, more: int = 3) -> Argv:
    """The printed resume command, pasted into bash as it is (`python` and `train.py` pointed at this
    interpreter and the repo), plus `trainer.max_steps=<its step + more> trainer.threads=1`."""

    def build(ctx: Ctx) -> list[str]:
        assert ctx.last is not None
        line = resume_line(ctx.last.out)
        match = re.match(r"^(\S*python[\d.]*)\s+(\S*train\.py)(.*)$", line)
        if not match:
            raise ArgvError(f"the printed resume line is not a train.py command: {line!r}")
        run_dir = ctx.path(f"<{name}>")
        target = read_step(run_dir / "checkpoints" / "last.pt")
        if not isinstance(target, int):
            raise ArgvError(f"no readable checkpoint in {run_dir} after the stop ({target})")
        ctx.memo["target"] = target + more
        shell = f"{shlex.quote(sys.executable)} {shlex.quote(str(TRAIN))}{match.group(3)}"
        return ["bash", "-c", f"{shell} trainer.max_steps={target + more} trainer.threads=1"]

    return build


def resume_further(name: str, more: int = 3) -> Argv:
    """The documented plain resume of a run that was stopped at an unknown step: `trainer.resume=DIR
    trainer.max_steps=<its step + more>`."""

    def build(ctx: Ctx) -> list[str]:
        run_dir = ctx.path(f"<{name}>")
        target = read_step(run_dir / "checkpoints" / "last.pt")
        if not isinstance(target, int):
            raise ArgvError(f"no readable checkpoint in {run_dir} ({target})")
        ctx.memo["target"] = target + more
        return train(f"trainer.resume=<q:{name}>", f"trainer.max_steps={target + more}")(ctx)

    return build


# Checks ------------------------------------------------------------------------------------------------


def read_step(path: Path) -> Any:
    """The step a checkpoint holds, or a word for why there is none."""
    import torch  # lazily: --help needs no torch

    if not path.is_file():
        return "missing"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        return state["step"] if isinstance(state, dict) and "step" in state else "no step"
    except Exception:  # a damaged file is a state like any other here
        return "unreadable"


def step_is(token: str, step: Optional[int] = None) -> Check:
    """The checkpoint of `token`'s run holds `step` (None: the target the command was built for)."""

    def check(ctx: Ctx, outcome: Outcome) -> Optional[str]:
        want = ctx.memo.get("target") if step is None else step
        got = read_step(ctx.path(token) / "checkpoints" / "last.pt")
        return None if got == want else f"{token}'s checkpoints/last.pt holds step {got}, expected {want}"

    return check


def no_checkpoint(token: str) -> Check:
    def check(ctx: Ctx, outcome: Outcome) -> Optional[str]:
        found = sorted(p.name for p in (ctx.path(token) / "checkpoints").glob("*.pt"))
        return f"a checkpoint was written in {token}: {found}" if found else None

    return check


def sweep_jobs_at(token: str, step: int, at_least: int) -> Check:
    def check(ctx: Ctx, outcome: Outcome) -> Optional[str]:
        done = [p for p in ctx.path(token).glob("*/checkpoints/last.pt") if read_step(p) == step]
        return None if len(done) >= at_least else f"{len(done)} job(s) of {token} reached step {step}, not {at_least}"

    return check


def file_exists(token: str) -> Check:
    def check(ctx: Ctx, outcome: Outcome) -> Optional[str]:
        return None if ctx.path(token).exists() else f"{ctx.sub(token)} was not written"

    return check


def file_absent(token: str) -> Check:
    def check(ctx: Ctx, outcome: Outcome) -> Optional[str]:
        return f"{ctx.sub(token)} exists: the checkpoint's code ran" if ctx.path(token).exists() else None

    return check


def both(*checks: Check) -> Check:
    def check(ctx: Ctx, outcome: Outcome) -> Optional[str]:
        problems = [p for c in checks if (p := c(ctx, outcome))]
        return "; ".join(problems) or None

    return check


def ready_file(token: str) -> Callable[[Ctx, str], bool]:
    return lambda ctx, out: ctx.path(token).is_file()


def ready_text(text: str, delay: float) -> Callable[[Ctx, str], bool]:
    def ready(ctx: Ctx, out: str) -> bool:
        if text not in out:
            return False
        seen = ctx.memo.setdefault(f"seen:{text}", time.monotonic())
        return time.monotonic() - seen >= delay

    return ready


# Setups: odd datasets, damaged checkpoints ---------------------------------------------------------------


def make_dirs(*tokens: str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        for token in tokens:
            ctx.path(token).mkdir(parents=True, exist_ok=True)

    return setup


def make_file(token: str, data: bytes = b"not a folder\n") -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        path = ctx.path(token)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    return setup


def chain(*setups: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        for s in setups:
            s(ctx)

    return setup


def fake_mnist(ctx: Ctx) -> None:
    """ROOT/MNIST/raw with the four IDX names, each a few bytes of garbage (a download cut short)."""
    raw = ctx.path("<scratch>/mnist/MNIST/raw")
    raw.mkdir(parents=True, exist_ok=True)
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        (raw / name).write_bytes(b"\x00\x00\x08\x03" + bytes(range(40)))


def junk_folder(ctx: Ctx) -> None:
    """A folder of files that are not images: a text file and a .png that is not a PNG."""
    folder = ctx.path("<scratch>/junk")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "readme.txt").write_text("no images here\n")
    (folder / "broken.png").write_bytes(b"this is not a png")


def few_images(ctx: Ctx) -> None:
    """Three real PNGs: fewer than one batch (debug=tiny's data.batch_size=32)."""
    from PIL import Image

    folder = ctx.path("<scratch>/three")
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(3):
        Image.new("RGB", (20, 20), (40 * i, 80, 120)).save(folder / f"img{i}.png")


def link_to_a(ctx: Ctx) -> None:
    link = ctx.path("<scratch>/link_to_a")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(ctx.path("<A>"), target_is_directory=True)


def remove_a_overrides(ctx: Ctx) -> None:
    ctx.path("<A>/.hydra/overrides.yaml").unlink()


def last_pt(ctx: Ctx) -> Path:
    return ctx.path("<A>/checkpoints/last.pt")


def raw_damage(how: Callable[[bytes], bytes]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        path = last_pt(ctx)
        path.write_bytes(how(path.read_bytes()))

    return setup


class _Evil:
    """Unpickling this runs a shell command: what a hostile 'checkpoint' downloaded from anywhere does."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


def evil_pickle(ctx: Ctx) -> None:
    last_pt(ctx).write_bytes(pickle.dumps({"G": _Evil(str(ctx.path("<scratch>/pwned")))}, protocol=2))


def edit(change: Callable[[dict], None]) -> Callable[[Ctx], None]:
    """Load A's last.pt, change it, save it back (torch.save of a plain dict, as the project writes)."""

    def setup(ctx: Ctx) -> None:
        import torch

        path = last_pt(ctx)
        state = torch.load(path, map_location="cpu", weights_only=True)
        change(state)
        torch.save(state, path)

    return setup


def _first(tensors: dict, pred: Callable[[str, Any], bool]) -> str:
    return next(k for k, v in tensors.items() if pred(k, v))


def _is_weight(key: str, value: Any) -> bool:
    return key.endswith("weight") and getattr(value, "is_floating_point", lambda: False)()


def poison(
    part: str, pred: Callable[[str, Any], bool] = _is_weight, value: float = float("nan")
) -> Callable[[dict], None]:
    def change(state: dict) -> None:
        tensor = state[part][_first(state[part], pred)]
        tensor[(0,) * tensor.dim()] = value  # the first element, whatever the memory format

    return change


def poison_adam(state: dict) -> None:
    moment = next(iter(state["opt_g"]["state"].values()))["exp_avg_sq"]
    moment[(0,) * moment.dim()] = float("nan")


def reshape_g(state: dict) -> None:
    import torch

    state["G"][_first(state["G"], _is_weight)] = torch.zeros(2, 2)


def garbage_rng(state: dict) -> None:
    import torch

    state["rng"]["torch"] = torch.zeros(5, dtype=torch.uint8)


# The cases -----------------------------------------------------------------------------------------------------


def refuse(*required: str, code: int = 2, forbidden: tuple[str, ...] = (), check: Optional[Check] = None) -> Expect:
    return Expect(code, required=required, forbidden=forbidden, check=check)


def rescue(run: str, steps: int = 9) -> Step:
    """The documented plain resume (`trainer.resume=RUN_DIR trainer.max_steps=N`), which must still work
    after a refused one."""
    return Step(
        train(f"trainer.resume=<{run}>", f"trainer.max_steps={steps}"),
        (Expect(0, may_change=(run,), check=step_is(f"<{run}>", steps)),),
        fail_as="lost",
    )


def new_run(name: str, args: tuple[str, ...], *expect: Expect, unsure: str = "", setup=None) -> Case:
    return Case(name, "override", [Step(train(*args), expect)], setup=setup, unsure=unsure)


def override_cases() -> list[Case]:
    cases = [
        new_run("unknown-key", ("optim.lrr=1e-3",), refuse("lrr", code=1)),
        new_run("unknown-option", ("loss=foo",), refuse("foo", code=1)),
        new_run("type-lr-abc", ("optim.lr=abc",), refuse("optim.lr", code=1)),
        new_run("type-max-steps-float", ("trainer.max_steps=1.5",), refuse("trainer.max_steps", code=1)),
        new_run("enum-precision", ("trainer.precision=fp64",), refuse("trainer.precision", code=1)),
        new_run("list-diffaugment", ("model.diffaugment=[rotate]",), refuse("model.diffaugment", code=1)),
        new_run("max-steps-0", ("trainer.max_steps=0",), refuse("trainer.max_steps")),
        new_run("lr-0", ("optim.lr=0",), refuse("optim.lr")),
        new_run("lr-negative", ("optim.lr=-1",), refuse("optim.lr")),
        new_run("lr-inf", ("optim.lr=inf",), refuse("optim.lr")),
        new_run("lr-nan", ("optim.lr=nan",), refuse("optim.lr")),
        new_run("lr-d-inf", ("optim.lr_d=inf",), refuse("optim.lr_d")),
        new_run("lr-decay-1.5", ("optim.lr_decay=1.5",), refuse("optim.lr_decay")),
        new_run("beta1-1", ("optim.beta1=1.0",), refuse("optim.beta1")),
        new_run("feature-matching-inf", ("loss.feature_matching=inf",), refuse("loss.feature_matching")),
        new_run("real-label-0.3", ("loss.real_label=0.3",), refuse("loss.real_label")),
        new_run("r1-inf", ("loss.r1=inf", "model.d_batchnorm=false"), refuse("loss.r1")),
        new_run("gp-nan", ("loss.gradient_penalty=nan", "model.d_batchnorm=false"), refuse("loss.gradient_penalty")),
        new_run("ema-decay-1", ("model.ema_decay=1.0",), refuse("model.ema_decay")),
        new_run("ema-kimg-inf", ("model.ema_kimg=inf",), refuse("model.ema_kimg")),
        new_run("minibatch-std-5", ("model.minibatch_std=5",), refuse("model.minibatch_std")),
        new_run("pack-3", ("model.pack=3",), refuse("model.pack")),
        new_run("g-width-huge", (f"model.g_width={BIG}",), refuse("model.g_width")),
        new_run("image-size-24", ("data.image_size=24",), refuse("data.image_size")),
        new_run("limit-above-dataset", ("data.limit=1000",), refuse("data.limit")),
        new_run(
            "threads-100000",
            ("trainer.threads=100000",),
            refuse("trainer.threads"),
            Expect(0, required=("trainer.threads",)),  # or clamped, with a warning naming the key
        ),
        new_run(
            "threads-huge",
            (f"trainer.threads={BIG}",),
            refuse("trainer.threads"),
            Expect(0, required=("trainer.threads",)),
        ),
        new_run("threads-negative", ("trainer.threads=-1",), refuse("trainer.threads")),
        new_run("device-tpu", ("trainer.device=tpu",), refuse("trainer.device")),
        new_run("device-cuda-99", ("trainer.device=cuda:99",), refuse("trainer.device")),
        new_run("eval-samples-5", ("trainer.eval_every=3", "trainer.eval_samples=5"), refuse("trainer.eval_samples")),
        new_run("download-digits", ("data.download=true",), refuse("data.download")),
        Case(
            "sweep-one-bad-job",
            "override",
            [
                Step(
                    train("optim.lr=0.002,-1", multirun=True),
                    (refuse("optim.lr", code=1, check=sweep_jobs_at("<new>", 6, 1)),),
                )
            ],
        ),
    ]
    if not _cuda_available():
        cases.append(new_run("device-cuda", ("trainer.device=cuda",), refuse("trainer.device")))
    return cases


def data_cases() -> list[Case]:
    def case(name: str, args: tuple[str, ...], required: tuple[str, ...], setup=None) -> Case:
        return Case(name, "data", [Step(train(*args), (refuse(*required),))], setup=setup)

    empty = make_dirs("<scratch>/empty")
    return [
        case("mnist-empty-root", ("data=mnist", "data.root=<scratch>/empty"), ("<scratch>/empty", "MNIST"), empty),
        case(
            "fashion-empty-root",
            ("data=fashion_mnist", "data.root=<scratch>/empty"),
            ("<scratch>/empty", "FashionMNIST"),
            empty,
        ),
        case("cifar10-empty-root", ("data=cifar10", "data.root=<scratch>/empty"), ("<scratch>/empty", "cifar"), empty),
        case("mnist-missing-root", ("data=mnist", "data.root=<scratch>/nowhere"), ("<scratch>/nowhere",)),
        case("mnist-garbage-files", ("data=mnist", "data.root=<scratch>/mnist"), ("MNIST",), fake_mnist),
        case(
            "stacked-mnist-empty",
            ("data=stacked", "data.source=mnist", "data.root=<scratch>/empty"),
            ("<scratch>/empty",),
            empty,
        ),
        case(
            "folder-root-is-file",
            ("data=folder", "data.root=<scratch>/afile"),
            ("<scratch>/afile",),
            make_file("<scratch>/afile"),
        ),
        case("folder-empty", ("data=folder", "data.root=<scratch>/empty"), ("<scratch>/empty",), empty),
        case("folder-missing", ("data=folder", "data.root=<scratch>/nowhere"), ("<scratch>/nowhere",)),
        case("folder-no-images", ("data=folder", "data.root=<scratch>/junk"), ("<scratch>/junk",), junk_folder),
        case(
            "folder-fewer-than-a-batch",
            ("data=folder", "data.root=<scratch>/three"),
            ("<scratch>/three|data.batch_size",),
            few_images,
        ),
    ]


def resume_cases() -> list[Case]:
    def refused(
        name: str, args: tuple[str, ...], *required: str, code: int = 2, run: str = "A", unsure: str = ""
    ) -> Case:
        """A resume of `run` that must be refused, after which the plain resume must still work."""
        step = Step(train(f"trainer.resume=<{run}>", *args), (refuse(*required, code=code),))
        return Case(name, "resume", [step, rescue(run)], unsure=unsure)

    def works(
        name: str, args: tuple[str, ...], run: str, *alternatives: Expect, steps: int = 9, unsure: str = "", setup=None
    ) -> Case:
        step = Step(train(*args), (Expect(0, may_change=(run,), check=step_is(f"<{run}>", steps)), *alternatives))
        return Case(name, "resume", [step], setup=setup, unsure=unsure)

    cuda = "trainer.device=cuda:99" if _cuda_available() else "trainer.device=cuda"
    return [
        refused("resume-change-loss", ("loss=hinge", "trainer.max_steps=9"), "loss"),
        refused("resume-change-seed", ("trainer.seed=1", "trainer.max_steps=9"), "trainer.seed"),
        refused("resume-change-image-size", ("data.image_size=32", "trainer.max_steps=9"), "data.image_size"),
        refused("resume-lr-negative", ("optim.lr=-1", "trainer.max_steps=9"), "optim.lr"),
        refused("resume-lr-inf", ("optim.lr=inf", "trainer.max_steps=9"), "optim.lr"),
        refused("resume-lr-decay-2", ("optim.lr_decay=2", "trainer.max_steps=9"), "optim.lr_decay"),
        refused("resume-device-cuda", (cuda, "trainer.max_steps=9"), "trainer.device"),
        refused("resume-threads-negative", ("trainer.threads=-1", "trainer.max_steps=9"), "trainer.threads"),
        refused("resume-unknown-key", ("optim.lrr=1", "trainer.max_steps=9"), "lrr", code=1),
        refused(
            "resume-precision-typo", ("trainer.precision=fp64", "trainer.max_steps=9"), "trainer.precision", code=1
        ),
        refused("resume-max-steps-below", ("trainer.max_steps=3",), "trainer.max_steps"),
        Case(
            "resume-into-another-run",
            "resume",
            [
                Step(train("trainer.resume=<A>", "hydra.run.dir=<B>", "trainer.max_steps=9"), (refuse("<B>"),)),
                rescue("A"),
            ],
        ),
        Case(
            "resume-fork-into-new-dir",
            "resume",
            [
                Step(
                    train("trainer.resume=<A>", "hydra.run.dir=<new>", "trainer.max_steps=9"),
                    (Expect(0, check=step_is("<new>", 9)), refuse("hydra.run.dir")),
                )
            ],
            unsure="a fork of A into a new dir is accepted (A untouched, the new dir at step 9) or refused naming "
            "hydra.run.dir; only a change to A is wrong",
        ),
        Case(
            "resume-best-pt",
            "resume",
            [Step(train("trainer.resume=<BEST>/checkpoints/best.pt", "trainer.max_steps=9"), (refuse("best.pt"),))],
        ),
        Case(
            "resume-auto-without-overrides-yaml",
            "resume",
            [
                Step(
                    train("trainer.resume=auto", "trainer.max_steps=9"),
                    (
                        refuse("overrides.yaml"),
                        Expect(0, may_change=("A",), check=step_is("<A>", 9)),  # or continued A in place
                    ),
                )
            ],
            setup=remove_a_overrides,
            unsure="either continue A in its own dir or refuse naming overrides.yaml; a fresh run elsewhere "
            "that silently forks A is 'silent'",
        ),
        Case(
            "resume-auto-sweep",
            "resume",
            [
                Step(
                    train("trainer.resume=auto", "optim.lr=0.002,0.003", "trainer.max_steps=9", multirun=True),
                    (
                        # each job continues its own run in place ...
                        Expect(0, may_change=("SW0", "SW1"), check=both(step_is("<SW0>", 9), step_is("<SW1>", 9))),
                        # ... or continues it into the new sweep's job dir, naming the run it continued
                        Expect(
                            0,
                            required=("outputs/sweep/0_optim.lr=0.002", "outputs/sweep/1_optim.lr=0.003"),
                            check=sweep_jobs_at("<new>", 9, 2),
                        ),
                    ),
                )
            ],
            unsure="in place, or forked into the new sweep dir from each matching run's checkpoint (the output must "
            "name the run continued); a fresh start of both jobs is 'silent'",
        ),
        works("resume-auto", ("trainer.resume=auto", "trainer.max_steps=9"), "A"),
        works("resume-auto-finds-sweep-job", ("trainer.resume=auto", "optim.lr=0.002", "trainer.max_steps=9"), "SW0"),
        works("resume-space-quoted", ("trainer.resume=<q:SPACE>", "trainer.max_steps=9"), "SPACE"),
        works(
            "resume-space-bare",
            ("trainer.resume=<SPACE>", "trainer.max_steps=9"),
            "SPACE",
            unsure="one shell word with a space, unquoted for Hydra",
        ),
        works("resume-equals-quoted", ("trainer.resume=<q:EQ>", "trainer.max_steps=9"), "EQ"),
        works(
            "resume-sweep-job-bare",
            ("trainer.resume=<SW0>", "trainer.max_steps=9"),
            "SW0",
            # or refused, naming the key and the path (whose '=' Hydra's grammar needs quoted)
            refuse("trainer.resume", "0_optim.lr=0.002", code=1),
            refuse("trainer.resume", "0_optim.lr=0.002", code=2),
            unsure="the project names sweep jobs with '='; resuming one by its bare path should work, or at "
            "least be refused naming trainer.resume and the path",
        ),
        works("resume-relative-path", ("trainer.resume=outputs/runs/a", "trainer.max_steps=9"), "A"),
        works("resume-checkpoint-file", ("trainer.resume=<A>/checkpoints/last.pt", "trainer.max_steps=9"), "A"),
        works("resume-at-max-steps", ("trainer.resume=<A>",), "A", steps=6),
        Case("resume-missing-path", "resume", [Step(train("trainer.resume=<scratch>/nope"), (refuse("nope"),))]),
        Case(
            "resume-empty-dir",
            "resume",
            [Step(train("trainer.resume=<scratch>/empty"), (refuse("<scratch>/empty"),))],
            setup=make_dirs("<scratch>/empty"),
        ),
    ]


# (name, setup, required, also for evaluate.py: None = no, or its extra arguments). Both commands name
# run A's directory, so the path at fault is that directory or its checkpoints/last.pt.
DAMAGES: list[tuple[str, Callable[[Ctx], None], tuple[str, ...], Optional[tuple[str, ...]]]] = [
    ("truncated", raw_damage(lambda b: b[: len(b) // 2]), ("<A>",), ()),
    ("random-bytes", raw_damage(lambda b: random.Random(0).randbytes(len(b))), ("<A>",), ()),
    ("empty-file", raw_damage(lambda b: b""), ("<A>",), ()),
    ("pickle-runs-code", evil_pickle, ("<A>",), ()),
    ("step-abc", edit(lambda s: s.update(step="abc")), ("<A>", "step"), ()),
    ("step-negative", edit(lambda s: s.update(step=-4)), ("<A>", "step"), None),
    ("G_ema-7", edit(lambda s: s.update(G_ema=7)), ("<A>", "G_ema"), ()),
    ("config-not-mapping", edit(lambda s: s.update(config=["debug=tiny"])), ("<A>", "config"), ()),
    ("missing-D", edit(lambda s: s.pop("D")), ("<A>",), None),
    ("G-wrong-shape", edit(reshape_g), ("net.0.weight",), ("use_ema=false",)),
    ("nan-G", edit(poison("G")), ("<A>", NONFINITE), ("use_ema=false",)),
    ("nan-G_ema", edit(poison("G_ema")), ("<A>", NONFINITE), ()),
    ("inf-D", edit(poison("D", value=float("inf"))), ("<A>", NONFINITE), None),
    ("nan-adam-state", edit(poison_adam), ("<A>", NONFINITE), None),
    (
        "nan-batchnorm-stats",
        edit(poison("G", lambda k, v: k.endswith("running_var"))),
        ("<A>", NONFINITE),
        ("use_ema=false", "bn_batches=0"),
    ),
    ("rng-garbage", edit(garbage_rng), ("<A>", "rng"), None),
    ("data-position-garbage", edit(lambda s: s.update(data={"epoch": "x", "batch": -5})), ("<A>", "data"), None),
]


def damaged_cases() -> list[Case]:
    cases = []
    for name, setup, required, eval_args in DAMAGES:
        check = file_absent("<scratch>/pwned") if name == "pickle-runs-code" else None
        # train.py may name the file, the run dir, or the key that holds it (trainer.resume)
        named = tuple("<A>|trainer.resume" if r == "<A>" else r for r in required)
        step = Step(train("trainer.resume=<A>", "trainer.max_steps=9"), (refuse(*named, check=check),))
        cases.append(Case(f"damaged-{name}-train", "damaged", [step], setup=setup))
        if eval_args is not None:
            step = Step(evaluate("checkpoint=<A>", *eval_args), (refuse(*required, check=check),))
            cases.append(Case(f"damaged-{name}-evaluate", "damaged", [step], setup=setup))
    return cases


LIVE_ARGS = ("trainer.max_steps=100000", "trainer.sample_every=50", "hydra.run.dir=<q:live>")
LIVE_HYDRA = ("<live>/.hydra/overrides.yaml", "<live>/.hydra/config.yaml")


def start_live() -> Step:
    """A run training in the background (a space in its dir), once it has written a checkpoint."""
    return Step(train(*LIVE_ARGS), background=True, ready=ready_file("<live>/checkpoints/last.pt"))


def stop_live(sig: signal.Signals = signal.SIGTERM) -> Step:
    code = {signal.SIGTERM: 143, signal.SIGINT: 130}[sig]
    return Step(lambda ctx: [], (Expect(code, required=("Resume with",)),), stop_background=sig)


def protect_cases() -> list[Case]:
    def into(name: str, run_dir: str, *required: str, setup=None, unsure: str = "") -> Case:
        step = Step(train(f"hydra.run.dir={run_dir}"), (refuse(*required),))
        return Case(name, "protect", [step], setup=setup, unsure=unsure)

    return [
        into("new-run-into-A", "<A>", "<A>"),
        into("new-run-into-A-trailing-slash", "<A>/", "<A>"),
        into("new-run-into-A-relative", "outputs/runs/a", "runs/a"),
        into("new-run-into-A-dotdot", "<A>/../a", "runs/a"),
        into("new-run-into-A-symlink", "<scratch>/link_to_a", "link_to_a|<A>", setup=link_to_a),
        into("new-run-into-space-run", "<q:SPACE>", "my run"),
        into("new-run-into-sweep-job", "<q:SW0>", "0_optim.lr=0.002"),
        into(
            "new-run-inside-A",
            "<A>/checkpoints",
            "<A>",
            unsure="a new run nested inside another run's folder adds files to it",
        ),
        Case(
            "new-run-interpolated-dir",
            "protect",
            [
                Step(
                    train("trainer.seed=7", "hydra.run.dir=<outputs>/runs/interp_${trainer.seed}"), (refuse("interp_"),)
                )
            ],
        ),
        Case(
            "new-run-interpolated-relative-dir",
            "protect",
            [Step(train("trainer.seed=7", "hydra.run.dir=outputs/runs/interp_${trainer.seed}"), (refuse("interp_"),))],
        ),
        Case(
            "sweep-into-earlier-sweep",
            "protect",
            [
                Step(
                    train("optim.lr=0.002,0.003", "hydra.sweep.dir=<SWEEP>", multirun=True),
                    (refuse("<SWEEP>"), refuse("0_optim.lr=0.002", code=1)),
                )
            ],
        ),
        Case(
            "sweep-other-values-into-earlier-sweep",
            "protect",
            [
                Step(
                    train("optim.lr=0.004,0.005", "hydra.sweep.dir=<SWEEP>", multirun=True),
                    (refuse("<SWEEP>"), Expect(0)),
                )
            ],
            unsure="new jobs beside the old ones may be fine, but the sweep's multirun.yaml must stay",
        ),
        Case(
            "evaluate-into-A",
            "protect",
            [Step(evaluate("checkpoint=<A>", "hydra.run.dir=<A>"), (refuse("<A>"),))],
        ),
        Case(
            "evaluate-leaves-run-alone",
            "protect",
            [Step(evaluate("checkpoint=<A>"), (Expect(0, check=file_exists("<new>/metrics.json")),))],
        ),
        Case(
            "evaluate-best-pt",
            "protect",
            [
                Step(
                    evaluate("checkpoint=<BEST>/checkpoints/best.pt"),
                    (Expect(0, check=file_exists("<new>/metrics.json")),),
                )
            ],
        ),
        Case(
            "live-second-resume",
            "protect",
            [
                start_live(),
                Step(train("trainer.resume=<q:live>"), (refuse("<live>|live run"),), keep=LIVE_HYDRA),
                stop_live(),
                Step(resume_further("live"), (Expect(0, check=step_is("<live>")),), fail_as="lost"),
            ],
        ),
        Case(
            "live-new-run-into-it",
            "protect",
            [
                start_live(),
                Step(train("hydra.run.dir=<q:live>"), (refuse("<live>|live run"),), keep=LIVE_HYDRA),
                stop_live(),
                Step(resume_further("live"), (Expect(0, check=step_is("<live>")),), fail_as="lost"),
            ],
        ),
    ]


def env_cases() -> list[Case]:
    under_file = make_file("<scratch>/afile")
    cases = [
        Case(
            "run-dir-under-a-file",
            "env",
            [Step(train("hydra.run.dir=<scratch>/afile/run"), (refuse("<scratch>/afile"),))],
            setup=under_file,
        ),
        Case("run-dir-in-sysfs", "env", [Step(train("hydra.run.dir=/sys/probe_run"), (refuse("/sys"),))]),
        Case(
            "sweep-dir-under-a-file",
            "env",
            [
                Step(
                    train("optim.lr=0.002,0.003", "hydra.sweep.dir=<scratch>/afile/sweep", multirun=True),
                    (refuse("<scratch>/afile"),),
                )
            ],
            setup=under_file,
        ),
        Case(
            "evaluate-dir-under-a-file",
            "env",
            [Step(evaluate("checkpoint=<A>", "hydra.run.dir=<scratch>/afile/eval"), (refuse("<scratch>/afile"),))],
            setup=under_file,
        ),
        Case(
            "resume-file-size-limit",
            "env",
            [
                Step(
                    train("trainer.resume=<A>", "trainer.max_steps=9"),
                    (Expect(2, required=("last.pt",), may_change=("A",), check=step_is("<A>", 6)),),
                    keep=("<A>/checkpoints/last.pt",),
                    limit_file_size=100_000,
                ),
                rescue("A"),
            ],
        ),
        Case(
            "nan-at-step-1-new-run",
            "env",
            [
                Step(
                    train("optim.lr=1e30"),
                    (
                        Expect(
                            3,
                            required=("step", "optim.lr"),
                            forbidden=("still holds", "last.pt holds"),  # no checkpoint exists to hold anything
                            check=no_checkpoint("<new>"),
                        ),
                    ),
                )
            ],
        ),
        Case(
            "nan-after-resume",
            "env",
            [
                Step(
                    train("trainer.resume=<A>", "optim.lr=1e30", "trainer.max_steps=9"),
                    (Expect(3, required=("step", "optim.lr"), may_change=("A",), check=step_is("<A>", 6)),),
                    keep=("<A>/checkpoints/last.pt",),
                )
            ],
        ),
        Case(
            "sigterm-resume-line-with-space",
            "env",
            [
                start_live(),
                stop_live(),
                Step(pasted_resume("live"), (Expect(0, check=step_is("<live>")),), fail_as="misleading"),
            ],
        ),
        Case(
            "sigint-resume-line-with-space-and-equals",
            "env",
            [
                Step(
                    train("trainer.max_steps=100000", "trainer.sample_every=50", "hydra.run.dir=<q:live_eq>"),
                    background=True,
                    ready=ready_file("<live_eq>/checkpoints/last.pt"),
                ),
                stop_live(signal.SIGINT),
                Step(pasted_resume("live_eq"), (Expect(0, check=step_is("<live_eq>")),), fail_as="misleading"),
            ],
        ),
        Case(
            "evaluate-ctrl-c",
            "env",
            [
                Step(
                    evaluate(
                        "checkpoint=<A>",
                        "num_samples=200000",
                        "data.num_samples=60000",
                        "metrics.classifier.min_accuracy=0",
                        "metrics.classifier.epochs=20",
                        fast=False,
                    ),
                    (Expect(130),),
                    interrupt=signal.SIGINT,
                    ready=ready_text("Evaluating", delay=2.0),
                )
            ],
        ),
        Case(
            "evaluate-missing-checkpoint", "env", [Step(evaluate("checkpoint=<scratch>/nope.pt"), (refuse("nope.pt"),))]
        ),
        Case("evaluate-no-checkpoint-given", "env", [Step(evaluate(), (refuse("checkpoint"),))]),
        Case(
            "evaluate-empty-dir",
            "env",
            [Step(evaluate("checkpoint=<scratch>/empty"), (refuse("<scratch>/empty"),))],
            setup=make_dirs("<scratch>/empty"),
        ),
        Case(
            "evaluate-num-samples-1",
            "env",
            [Step(evaluate("checkpoint=<A>", "num_samples=1"), (refuse("num_samples"),))],
        ),
        Case(
            "evaluate-num-samples-abc",
            "env",
            [Step(evaluate("checkpoint=<A>", "num_samples=abc"), (refuse("num_samples", code=1),))],
        ),
        Case(
            "evaluate-threads-huge", "env", [Step(evaluate("checkpoint=<A>", f"threads={BIG}"), (refuse("threads"),))]
        ),
        Case(
            "evaluate-device-cuda-99", "env", [Step(evaluate("checkpoint=<A>", "device=cuda:99"), (refuse("device"),))]
        ),
    ]
    return cases


def all_cases() -> list[Case]:
    return [*override_cases(), *data_cases(), *resume_cases(), *damaged_cases(), *protect_cases(), *env_cases()]


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


# Snapshots ----------------------------------------------------------------------------------------------------


def snapshot(ctx: Ctx) -> dict[str, RunState]:
    """sha256 of every file of every existing run (a run's nested runs and `.lock` aside), and the step
    in each of its checkpoints."""
    paths = ctx.paths()
    run_dirs = {name: paths[name] for name in RUNS}
    nested = {p.resolve() for p in run_dirs.values()}
    states = {}
    for name, top in run_dirs.items():
        files, steps = {}, {}
        for folder, dirs, names in os.walk(top):
            here = Path(folder)
            if name in SHALLOW:
                dirs[:] = []
            dirs[:] = [d for d in dirs if (here / d).resolve() not in nested]
            for n in names:
                if n == ".lock":
                    continue
                path = here / n
                rel = str(path.relative_to(top))
                try:
                    files[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
                except OSError as err:
                    files[rel] = f"unreadable ({err.strerror})"
                if n in ("last.pt", "best.pt"):
                    steps[rel] = read_step(path)
        states[name] = RunState(files, steps)
    return states


def diff(before: RunState, after: RunState) -> str:
    """What changed in one run, in a few words; '' when nothing did."""
    added = sorted(set(after.files) - set(before.files))
    removed = sorted(set(before.files) - set(after.files))
    changed = sorted(k for k in set(before.files) & set(after.files) if before.files[k] != after.files[k])
    parts = [
        f"{label} {', '.join(items[:3])}{' ...' if len(items) > 3 else ''}"
        for label, items in (("added", added), ("removed", removed), ("changed", changed))
        if items
    ]
    parts += [
        f"step {before.steps.get(k)} -> {after.steps.get(k)} in {k}"
        for k in sorted(set(before.steps) | set(after.steps))
        if before.steps.get(k) != after.steps.get(k)
    ]
    return "; ".join(parts)


def file_hashes(ctx: Ctx, tokens: tuple[str, ...]) -> dict[str, Optional[str]]:
    hashes = {}
    for token in tokens:
        path = ctx.path(token)
        hashes[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    return hashes


def tree(path: Path) -> dict[str, int]:
    """Every file under `path` with its size (the 'was anything written' question)."""
    if not path.exists():
        return {}
    return {str(p): p.stat().st_size for p in path.rglob("*") if p.is_file()}


# Running -----------------------------------------------------------------------------------------------------

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}


def start(ctx: Ctx, argv: list[str], index: int, file_size: Optional[int]) -> tuple[subprocess.Popen, Path, Path]:
    logs = ctx.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    out_file, err_file = logs / f"{ctx.case}.{index}.out", logs / f"{ctx.case}.{index}.err"
    preexec = None
    if file_size is not None:

        def preexec() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    with open(out_file, "wb") as out, open(err_file, "wb") as err:
        proc = subprocess.Popen(
            argv,
            cwd=ctx.work,
            env=ENV,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,  # its own process group: a Ctrl-C or a kill reaches it and its workers only
            preexec_fn=preexec,
        )
    return proc, out_file, err_file


def read_output(out_file: Path, err_file: Path) -> str:
    return out_file.read_text(errors="replace") + err_file.read_text(errors="replace")


def finish(proc: subprocess.Popen, out_file: Path, err_file: Path, began: float, timeout: float) -> Outcome:
    note = ""
    try:
        proc.wait(timeout=max(1.0, timeout - (time.monotonic() - began)))
    except subprocess.TimeoutExpired:
        kill_group(proc)
        note = f"timed out after {timeout:.0f} s and was killed"
    code = None if note else proc.returncode
    return Outcome(code, read_output(out_file, err_file), time.monotonic() - began, note)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_ready(ctx: Ctx, step: Step, proc: subprocess.Popen, out_file: Path, err_file: Path, timeout: float) -> bool:
    """Until `step.ready` holds (True) or the command ends or the timeout passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if step.ready is None or step.ready(ctx, read_output(out_file, err_file)):
            return True
        time.sleep(0.2)
    return False


def execute(ctx: Ctx, step: Step, index: int) -> Optional[Outcome]:
    """Run one step; None for a background start that is now running."""
    if step.stop_background is not None:
        assert ctx.bg is not None, "stop_background without a background step"
        proc, out_file, err_file = ctx.bg
        ctx.bg = None
        began = time.monotonic()
        if proc.poll() is None:
            target = proc.pid
            if step.stop_background == signal.SIGINT:  # Ctrl-C at a terminal: the whole foreground group
                os.killpg(target, signal.SIGINT)
            else:  # `kill PID`
                os.kill(target, step.stop_background)
        return finish(proc, out_file, err_file, began, step.timeout)
    argv = step.argv(ctx)
    log.debug("%s: %s", ctx.case, shlex.join(argv))
    began = time.monotonic()
    proc, out_file, err_file = start(ctx, argv, index, step.limit_file_size)
    if step.background:
        if wait_ready(ctx, step, proc, out_file, err_file, step.timeout):
            ctx.bg = (proc, out_file, err_file)
            return None
        if proc.poll() is None:
            kill_group(proc)
        outcome = Outcome(proc.returncode, read_output(out_file, err_file), time.monotonic() - began)
        outcome.note = "the background run ended (or never became ready) before it was signalled"
        return outcome
    if step.interrupt is not None:
        if wait_ready(ctx, step, proc, out_file, err_file, step.timeout):
            os.killpg(proc.pid, step.interrupt)
        else:
            ctx.memo["not_interrupted"] = True
    return finish(proc, out_file, err_file, began, step.timeout)


def message_of(out: str) -> str:
    """The line a user reads: a traceback's exception line, else the first ERROR log line (with what
    follows it up to a blank line or the next log line), else the first block of output that is not a
    log line (Hydra's own errors), else the last line."""
    lines = [x.rstrip() for x in out.splitlines()]
    if "Traceback" in out:
        begin = next(i for i, line in enumerate(lines) if "Traceback" in line)
        raised = [x for x in lines[begin:] if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", x)]
        if raised:
            return raised[-1]
    starts = [i for i, line in enumerate(lines) if "[ERROR]" in line]
    starts += [i for i, line in enumerate(lines) if line.strip() and not _log_or_hint(line)]
    if starts:
        first = lines[starts[0]]
        text = [first.split("] - ", 1)[1] if "] - " in first else first.strip()]
        for follow in lines[starts[0] + 1 :]:
            if not follow.strip() or _log_or_hint(follow):
                break
            text.append(follow.strip())
        return " ".join(text)
    tail = [x for x in lines if x.strip()]
    return tail[-1].split("] - ", 1)[-1].strip() if tail else ""


def _log_or_hint(line: str) -> bool:
    """A log line ('[date][name][LEVEL] - ...') or Hydra's boilerplate after an error."""
    return line.startswith("[") or "HYDRA_FULL_ERROR" in line or line.startswith("See https://hydra.cc")


def contains(out: str, wanted: str) -> bool:
    return any(alt.lower() in out.lower() for alt in wanted.split("|"))


def judge(
    ctx: Ctx,
    step: Step,
    outcome: Outcome,
    before: dict[str, RunState],
    after: dict[str, RunState],
    kept: tuple[dict, dict],
    wrote_new: bool,
) -> tuple[str, list[str]]:
    """The class of one step's outcome and the reasons for it: judged against each expectation of its
    exit code (the main one when none has it), and the kindest verdict wins."""
    changes = {name: d for name in before if (d := diff(before[name], after[name]))}
    out = outcome.out
    common: list[tuple[str, str]] = []
    for path, digest in kept[0].items():
        if kept[1][path] != digest:
            common.append(("lost", f"{path} changed"))
    if outcome.note:
        common.append(("traceback" if outcome.code is None else "misleading", outcome.note))
    if (outcome.code is not None and outcome.code < 0) or "Traceback" in out:
        common.append(("traceback", f"exit {outcome.code}" + (", a traceback" if "Traceback" in out else "")))
    if "nothing was written" in out.lower() and (changes or wrote_new):
        common.append(("misleading", "says 'Nothing was written' but files were written"))

    def against(expect: Expect) -> list[tuple[str, str]]:
        problems = [
            ("lost", f"{name} ({ctx.paths()[name]}): {d}")
            for name, d in changes.items()
            if name not in expect.may_change
        ]
        if outcome.code is None:
            return problems
        if outcome.code != expect.code:
            codes = " or ".join(str(e.code) for e in step.expect)
            problems.append(("silent" if outcome.code == 0 else "misleading", f"exit {outcome.code}, expected {codes}"))
            return problems
        weak = "silent" if expect.code == 0 else "misleading"
        missing = [r for r in expect.required if not contains(out, ctx.sub(r))]
        if missing:
            problems.append((weak, f"the output lacks {missing}"))
        present = [f for f in expect.forbidden if contains(out, ctx.sub(f))]
        if present:
            problems.append(("misleading", f"the output says {present}"))
        if expect.check is not None and (problem := expect.check(ctx, outcome)):
            problems.append(("lost" if "the checkpoint's code ran" in problem else weak, problem))
        return problems

    candidates = [e for e in step.expect if e.code == outcome.code] or [step.expect[0]]
    verdicts = [common + against(e) for e in candidates]
    problems = max(verdicts, key=lambda ps: CLASSES.index(worst("clear", *(c for c, _ in ps))))
    if not problems:
        return "clear", []
    cls = worst(*(p[0] for p in problems))
    if step.fail_as:
        cls = worst(cls, step.fail_as)
    return cls, [f"{c}: {why}" for c, why in problems]


def run_case(ctx: Ctx, case: Case) -> Verdict:
    ctx.case, ctx.last, ctx.memo = case.name, None, {}
    shutil.rmtree(ctx.outputs, ignore_errors=True)
    shutil.copytree(ctx.pristine, ctx.outputs, symlinks=True)
    for token in ("<new>", "<scratch>", "<live>", "<live_eq>"):
        shutil.rmtree(ctx.path(token), ignore_errors=True)
    if case.setup is not None:
        case.setup(ctx)
    verdicts: list[Verdict] = []
    try:
        for index, step in enumerate(case.steps):
            before = snapshot(ctx)
            kept_before = file_hashes(ctx, step.keep)
            new_before = tree(ctx.path("<new>"))
            try:
                outcome = execute(ctx, step, index)
            except ArgvError as err:
                cls = step.fail_as or "misleading"
                verdicts.append(Verdict(cls, None, str(err), [f"{cls}: {err}"]))
                break
            if outcome is None:  # a background run, now running
                continue
            ctx.last = outcome
            after = snapshot(ctx)
            wrote_new = tree(ctx.path("<new>")) != new_before
            if step.background:  # it ended before it could be signalled
                cls = "traceback" if "Traceback" in outcome.out or (outcome.code or 0) < 0 else "misleading"
                verdicts.append(Verdict(cls, outcome.code, message_of(outcome.out), [f"{cls}: {outcome.note}"]))
                break
            cls, reasons = judge(
                ctx, step, outcome, before, after, (kept_before, file_hashes(ctx, step.keep)), wrote_new
            )
            if ctx.memo.pop("not_interrupted", False):
                reasons.append("note: the command ended before the signal could be sent")
            if len(case.steps) > 1:
                reasons = [f"step {index + 1}: {r}" for r in reasons]
            verdicts.append(Verdict(cls, outcome.code, message_of(outcome.out), reasons))
    finally:
        if ctx.bg is not None:
            kill_group(ctx.bg[0])
            ctx.bg = None
    if not verdicts:
        return Verdict("misleading", None, "", ["no step ran"])
    decisive = min(verdicts, key=lambda v: CLASSES.index(v.cls))
    if decisive.cls == "clear":
        decisive = next((v for v in verdicts if v.code not in (0, None)), verdicts[0])
    reasons = [r for v in verdicts for r in v.reasons]
    return Verdict(decisive.cls, decisive.code, decisive.message, reasons)


# The existing runs -------------------------------------------------------------------------------------------


def make_pristine(base: Path) -> Path:
    """Train the existing runs into base/pristine/outputs once (reused when already complete)."""
    pristine = base / "pristine"
    done = pristine / "complete"
    if done.is_file():
        log.info("Reusing the existing runs in %s", pristine / "outputs")
        return pristine / "outputs"
    shutil.rmtree(pristine, ignore_errors=True)
    pristine.mkdir(parents=True)
    ctx = Ctx(work=pristine, pristine=pristine / "outputs", case="make-runs")
    for index, (multirun, args) in enumerate(MAKE_RUNS):
        argv = train(*args, multirun=multirun)(ctx)
        log.info("Making an existing run: %s", " ".join(argv[2:]))
        proc, out_file, err_file = start(ctx, argv, index, None)
        outcome = finish(proc, out_file, err_file, time.monotonic(), 300)
        if outcome.code != 0:
            raise SystemExit(f"probe: could not make the existing runs ({shlex.join(argv)}):\n{outcome.out[-3000:]}")
    missing = [f"{name}: {rel}" for name, rel in RUNS.items() if not (ctx.outputs / rel).is_dir()]
    if not (ctx.outputs / RUNS["BEST"] / "checkpoints" / "best.pt").is_file():
        missing.append("BEST: checkpoints/best.pt")
    if missing:
        raise SystemExit(f"probe: the existing runs lack {missing}")
    done.write_text("ok\n")
    return ctx.outputs


# Report ------------------------------------------------------------------------------------------------------


def report(cases: list[Case], verdicts: list[Verdict]) -> str:
    width = max(len(c.name) for c in cases)
    lines = [f"{'case':<{width}}  {'family':<8}  {'exit':>4}  {'class':<10}  message", "-" * (width + 120)]
    for case, v in zip(cases, verdicts):
        code = "-" if v.code is None else str(v.code)
        message = " ".join(v.message.split())[:160]
        lines.append(f"{case.name:<{width}}  {case.family:<8}  {code:>4}  {v.cls:<10}  {message}")
    bad = [(c, v) for c, v in zip(cases, verdicts) if v.cls != "clear"]
    if bad:
        lines += ["", "Not clear:"]
        for case, v in bad:
            lines.append(f"- {case.name} [{v.cls}]")
            lines += [textwrap.indent(textwrap.fill(r, 116), "    ") for r in v.reasons]
            lines.append(textwrap.indent(textwrap.fill("message: " + " ".join(v.message.split())[:600], 116), "    "))
    unsure = [c for c in cases if c.unsure]
    if unsure:
        lines += ["", "Expectations open to debate:"]
        lines += [f"- {c.name}: {c.unsure}" for c in unsure]
    counts = {cls: sum(v.cls == cls for v in verdicts) for cls in (*CLASSES, PROBE_ERROR)}
    errors = f" probe_errors={counts[PROBE_ERROR]}" if counts[PROBE_ERROR] else ""
    lines += [
        "",
        f"probe tried={len(verdicts) - counts[PROBE_ERROR]} clear={counts['clear']} misleading={counts['misleading']} "
        f"tracebacks={counts['traceback']} silent={counts['silent']} lost={counts['lost']}{errors}",
    ]
    return "\n".join(lines)


def describe(case: Case) -> str:
    parts = []
    for step in case.steps:
        if step.background:
            parts.append("start a run in the background")
        elif step.stop_background is not None:
            parts.append(f"{step.stop_background.name} it -> exit {step.expect[0].code}")
        else:
            alts = " or ".join(
                f"exit {e.code}"
                + (f" naming {list(e.required)}" if e.required else "")
                + (f", may change {list(e.may_change)}" if e.may_change else "")
                for e in step.expect
            )
            parts.append(("rescue: " if step.fail_as == "lost" else "") + alts)
    return f"{case.name} [{case.family}]: " + "; then ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, help="scratch area (default: a fresh temp dir, removed at the end)")
    parser.add_argument(
        "--only", default="", help="run the cases whose name or family holds this substring (a,b: either)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="cases run at once (default 1: the machine is shared)")
    parser.add_argument("--list", action="store_true", help="list the cases and their expectations, run nothing")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each command line")
    args = parser.parse_args()
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="[probe] %(message)s")

    wanted = args.only.split(",")
    cases = [c for c in all_cases() if any(w in c.name or w in c.family for w in wanted)]
    if args.list:
        print("\n".join(describe(c) for c in cases))
        return 0
    if not cases:
        log.error("No case matches --only %r.", args.only)
        return 2
    names = [c.name for c in all_cases()]
    assert len(names) == len(set(names)), "case names must be unique"

    # The commands must get Ctrl-C as a terminal gives it: a shell starts a background job with SIGINT
    # ignored, and an ignored signal stays ignored across exec (Python then installs no KeyboardInterrupt).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    base = args.work.resolve() if args.work else Path(tempfile.mkdtemp(prefix="probe-")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    log.info("Scratch area: %s", base)
    began = time.monotonic()
    pristine = make_pristine(base)
    jobs = max(1, min(args.jobs, len(cases)))
    verdicts: list[Optional[Verdict]] = [None] * len(cases)
    done = [0]
    lock = threading.Lock()

    def worker(n: int) -> None:
        ctx = Ctx(work=base / f"w{n}", pristine=pristine)
        for i in range(n, len(cases), jobs):
            t0 = time.monotonic()
            try:
                verdicts[i] = run_case(ctx, cases[i])
            except Exception as err:  # a bug of this probe, not of the tool: reported apart, the others go on
                log.exception("The probe itself failed on %s", cases[i].name)
                verdicts[i] = Verdict(PROBE_ERROR, None, f"{type(err).__name__}: {err}", ["the probe failed"])
            with lock:
                done[0] += 1
                log.info(
                    "[%d/%d] %s: %s (%.0f s)",
                    done[0],
                    len(cases),
                    cases[i].name,
                    verdicts[i].cls,
                    time.monotonic() - t0,
                )

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(worker, n) for n in range(jobs)]:
            future.result()
    print(report(cases, [v for v in verdicts if v is not None]))
    log.info("%d case(s) in %.0f s; scratch area %s", len(cases), time.monotonic() - began, base)
    if not args.work:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if all(v is not None and v.cls == "clear" for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
