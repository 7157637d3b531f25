"""The console commands pip installs: `dcgan-train` runs train.py and `dcgan-evaluate` evaluate.py, as
`python train.py` / `python evaluate.py` would (same arguments, exit codes and output folders).

The two programs live at the top of a clone; a wheel carries them in gan/commands/ and configs/ in
gan/configs/ (pyproject.toml's package-dir), so one copy of each is kept. An editable install runs
the clone's own files."""

import runpy
from pathlib import Path


def run_program(name: str) -> None:
    here = Path(__file__).parent
    program = next(path for path in (here / "commands" / name, here.parent / name) if path.is_file())
    runpy.run_path(str(program), run_name="__main__")


def train() -> None:
    run_program("train.py")


def evaluate() -> None:
    run_program("evaluate.py")
