"""The console commands pip installs: `dcgan-train` runs train.py and `dcgan-evaluate` evaluate.py, as
`python train.py` / `python evaluate.py` would (same arguments, exit codes and output folders).

The two programs live at the top of a clone; a wheel carries them in gan/commands and configs/ in
gan/configs (pyproject.toml's package-dir), so one copy of each is kept. An editable install runs
the clone's own files."""

import importlib.util
from pathlib import Path
from types import ModuleType


def program(name: str) -> ModuleType:
    """train.py or evaluate.py, loaded from the wheel's gan/commands or else from the clone."""
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
