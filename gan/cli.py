"""The console commands pip installs: `dcgan-train` runs train.py, `dcgan-evaluate` evaluate.py and
`dcgan-generate` generate.py, as `python train.py` etc. would (same arguments, exit codes and output folders).

The programs live at the top of a clone; a wheel carries them in gan/commands and configs/ in
gan/configs (pyproject.toml's package-dir), so one copy of each is kept. An editable install runs
the clone's own files."""

import importlib.util
from pathlib import Path
from types import ModuleType


def program(name: str) -> ModuleType:
    """train.py, evaluate.py or generate.py, loaded from the wheel's gan/commands or else from the clone."""
    here = Path(__file__).parent
    path = next(path for path in (here / "commands" / f"{name}.py", here.parent / f"{name}.py") if path.is_file())
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train() -> None:
    program("train").cli("dcgan-train")


def evaluate() -> None:
    program("evaluate").cli("dcgan-evaluate")


def generate() -> None:
    program("generate").cli("dcgan-generate")
