"""The console commands pip installs: `dcgan-train` runs train.py as `python train.py` would, and so on. A wheel
carries the programs in gan/commands (pyproject.toml's package-dir); a clone, or an editable install, its own files."""

import functools
import runpy
from pathlib import Path


def run(name: str) -> None:
    here = Path(__file__).parent
    path = next(path for path in (here / "commands" / f"{name}.py", here.parent / f"{name}.py") if path.is_file())
    runpy.run_path(str(path), run_name=name)["cli"](f"dcgan-{name}")  # NAME.py's cli, its `__main__` block skipped


train, evaluate, generate = (functools.partial(run, name) for name in ("train", "evaluate", "generate"))
