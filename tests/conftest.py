"""Shared fixtures: the real configs composed with Hydra's compose API, shrunk to test size."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import io
import logging
import os
import runpy
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
import torchvision
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from torch import Tensor, nn

from gan.checkpoint import save_checkpoint
from gan.config import ClassifierConfig, TrainConfig, to_plain, validate
from gan.core.models import Discriminator, Generator
from gan.device import available_cpus

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"

# Every test starts from configs/debug/tiny.yaml; a caller's own debug=... comes later and replaces it. tiny trains
# on the CPU; GAN_TEST_DEVICE=cuda moves every training run of the suite to the GPU.
DEVICE = os.environ.get("GAN_TEST_DEVICE")
TINY = ["debug=tiny", *([f"trainer.device={DEVICE}"] if DEVICE else [])]


# Every process the tests start, counted and printed at the end (each Python process pays seconds of imports).
STARTED: list[str] = []
_popen_init = subprocess.Popen.__init__


def _counted_popen_init(self: subprocess.Popen, args: object, *rest: object, **kwargs: object) -> None:
    STARTED.append(args if isinstance(args, str) else " ".join(map(str, args)))  # type: ignore[arg-type]
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _counted_popen_init  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker (and each process it starts) gets its share of the cores for OpenMP."""
    # set here, before the workers start: set in a worker it missed the pools already loaded (97 s, not 92 s)
    workers = getattr(config.option, "numprocesses", None)  # the controller's, an int once xdist resolved `auto`
    if isinstance(workers, int) and workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, available_cpus() // workers))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its count goes to the controller
        session.config.workeroutput["started"] = STARTED


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: known only where it is installed
def pytest_testnodedown(node: object, error: object) -> None:
    STARTED.extend(getattr(node, "workeroutput", {}).get("started", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    python = [command for command in STARTED if "python" in Path(command.split()[0]).name or "torchrun" in command]
    terminalreporter.write_line(f"processes started by the tests: {len(STARTED)}, of them Python: {len(python)}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `cuda` run where a CUDA device is, and are skipped (with the reason) elsewhere."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def compose_config(*overrides: str) -> TrainConfig:
    """The real configs/train.yaml with TINY (debug=tiny), then `overrides`, applied and validated."""
    GlobalHydra.instance().clear()  # nested initialize() raises; start clean every time
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*TINY, *overrides])
    typed = validate(cfg)
    typed.check()  # as gan.training.train will: a test of a refused value may stop here
    return typed


def run_train(
    *overrides: str, cwd: Path | None = None, tiny: bool = True, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """`python train.py [TINY] OVERRIDES` run in this process by train.main; `timeout` is ignored (pytest-timeout's)."""
    flags = [o for o in overrides if o.startswith("-")]  # -m before the overrides, as on a command line
    rest = [o for o in overrides if not o.startswith("-")]
    return in_process(importlib.import_module("train").main, [*flags, *(TINY if tiny else []), *rest], cwd)


def run_evaluate(*overrides: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real command line `python evaluate.py OVERRIDES`, run in this process by evaluate.main."""
    return in_process(importlib.import_module("evaluate").main, list(overrides), cwd)


def run_script(name: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python scripts/NAME ARGS` run in this process (runpy, as `__main__`): its exit code and output."""

    def main(argv: list[str]) -> int:
        sys.argv = [str(ROOT / "scripts" / name), *argv]  # in_process puts it back
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as stop:
            return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        return 0

    return in_process(main, list(args), cwd)


def in_process(main: Callable[[list[str]], int], argv: list[str], cwd: Path | None) -> subprocess.CompletedProcess:
    """main(argv)'s exit code and output, run in `cwd` (the repository's by default); process-wide state is put back."""
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, os.getcwd(), dict(os.environ), sys.argv[:], torch.get_num_threads())
    deterministic = torch.are_deterministic_algorithms_enabled()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    root.handlers = [logging.StreamHandler(err)]  # before Hydra configures logging: as a shell shows it
    root.setLevel(logging.INFO)
    try:
        os.chdir(cwd or ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        root.handlers, level, cwd_before, environ, sys.argv, threads = saved
        root.setLevel(level)
        os.chdir(cwd_before)
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        GlobalHydra.instance().clear()
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def output_of(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr  # Hydra's logging writes to stdout


def snapshot(*folders: Path) -> dict[str, str]:
    """Every file under the folders (hidden ones too), by path -> sha256 of its bytes."""
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for folder in folders
        for path in sorted(Path(folder).rglob("*"))
        if path.is_file()
    }


def tiny_checkpoint(tmp_path: Path, *overrides: str, ema: bool = True) -> Path:
    """A checkpoint with untrained weights and the real config: enough to evaluate."""
    cfg = compose_config("data.num_samples=1200", *overrides)
    torch.manual_seed(0)
    num_classes = 10 if cfg.model.conditional else 0  # digits' classes
    G = Generator(cfg.model.z_dim, cfg.model.g_width, cfg.data.channels, cfg.data.image_size, num_classes)
    averaged = torch.optim.swa_utils.AveragedModel(G, use_buffers=True) if ema else None
    if averaged is not None:
        with torch.no_grad():
            for p in averaged.module.parameters():
                p.mul_(0.5)  # so the EMA generator differs from G
    state = {"G": G.state_dict(), "D": {}, "G_ema": averaged.state_dict() if averaged else None, "step": 3}
    save_checkpoint({**state, "num_classes": num_classes, "config": to_plain(cfg)}, tmp_path / "ckpt.pt")
    return tmp_path / "ckpt.pt"


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """The session's one `python train.py debug=tiny` run (6 steps); a test that writes into it copies it first."""
    run_dir = tmp_path_factory.mktemp("tiny") / "run"
    result = run_train(f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return run_dir


@pytest.fixture(scope="session")
def classifier_cache(tmp_path_factory) -> Path:
    """classifiers/ with the tiny runs' metrics classifier, trained once: a test copies it into its data.root."""
    from gan.evaluation.metrics import load_or_train_classifier

    root = tmp_path_factory.mktemp("data")
    load_or_train_classifier(
        dataclasses.replace(compose_config().data, root=str(root)), ClassifierConfig(), torch.device("cpu")
    )
    return root / "classifiers"


@pytest.fixture(autouse=True)
def _seed_and_clean_hydra():
    torch.manual_seed(0)
    threads = torch.get_num_threads()  # a test that calls train() directly sets the run's count: give it back
    yield
    torch.set_num_threads(threads)
    GlobalHydra.instance().clear()


@pytest.fixture
def one_thread():
    """One torch thread for in-process evaluations (two collapse when another process holds a core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_gan() -> tuple[Generator, Discriminator]:
    torch.manual_seed(0)
    return Generator(z_dim=16, width=8, channels=1, image_size=16), Discriminator(width=8, channels=1, image_size=16)


# stand-ins for the two Inception-v3 files (no weights can be downloaded here) ---------------------


class TinyNVlabsInception(nn.Module):
    """NVlabs' TorchScript Inception-v3 in miniature: uint8 RGB resized to 299 px inside, features or logits."""

    def __init__(self, dims: int = 2048):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, kernel_size=8, stride=8)
        self.features = nn.Linear(16, dims)
        self.logits = nn.Linear(dims, 1008)

    def forward(self, img: Tensor, return_features: bool = False) -> Tensor:
        assert img.dtype == torch.uint8, "expects uint8 images in [0, 255]"
        assert img.dim() == 4 and img.size(1) == 3, "expects RGB images (N, 3, H, W)"
        x = F.interpolate(img.float(), size=[299, 299], mode="bilinear", align_corners=False)
        x = torch.relu(self.conv((x - 128) / 128)).mean(dim=[2, 3])
        features = torch.relu(self.features(x))
        return features if return_features else self.logits(features)


def write_torchscript(module: nn.Module, path: Path) -> Path:
    """torch.jit.script(module).save(path), the format of NVlabs' file."""
    with warnings.catch_warnings():  # torch 2.x deprecates TorchScript (FutureWarning)
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.script(module.eval()).save(str(path))
    return path


@pytest.fixture(scope="session")
def inception_weights(tmp_path_factory) -> Path:
    """Random weights in torch-fidelity's format (95 MB, as the real file): torchvision's Inception3 (1008 classes,
    no aux head), key for key; He-scaled weights and BatchNorm near the identity keep its features finite."""
    template = torchvision.models.inception_v3(weights=None, aux_logits=False, num_classes=1008, init_weights=False)
    gen = torch.Generator().manual_seed(0)
    state = {}
    for key, like in template.state_dict().items():
        if not like.is_floating_point():  # num_batches_tracked
            state[key] = like.clone()
        elif like.dim() > 1:  # conv and linear weights: He et al. 2015's scale, sqrt(2 / fan_in)
            state[key] = torch.randn(like.shape, generator=gen) * (2 / like[0].numel()) ** 0.5
        elif key.endswith(("running_var", "bn.weight")):
            state[key] = torch.rand(like.shape, generator=gen) + 0.5
        else:  # biases and running means
            state[key] = torch.randn(like.shape, generator=gen) * 0.1
    path = tmp_path_factory.mktemp("inception") / "weights-inception-random.pth"
    torch.save(state, path)
    return path


@pytest.fixture(scope="session")
def nvlabs_inception(tmp_path_factory) -> Path:
    """A TorchScript file with NVlabs' signature (TinyNVlabsInception)."""
    torch.manual_seed(0)
    return write_torchscript(TinyNVlabsInception(), tmp_path_factory.mktemp("inception") / "inception-tiny.pt")
