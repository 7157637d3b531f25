"""What a practitioner sees in TensorBoard, in a real browser: train the runs of docs/watching.md
with the README's own commands, serve them as `tensorboard --logdir` does, open each page in
headless Chromium at the window sizes people use, and save the PNGs of docs/images/.

    python -m pip install -c constraints.txt -e '.[screenshots]'   # Playwright, the browser driver
    apt-get install -y chromium                             # the browser (Debian's; no download)
    python scripts/tensorboard_screenshots.py runs /tmp/watch     # train the runs (~4 min on 2 cores)
    python scripts/tensorboard_screenshots.py shoot /tmp/watch    # the screenshots, into docs/images
    python scripts/tensorboard_screenshots.py page LOGDIR NAME --page text --size 1400 1100   # any folder

`runs` trains RUNS from the folder given, so every run gets Hydra's default name under outputs/, as
a user's would: a single run with the FID measured, the README's sweep `-m optim.lr=1e-4,1e-3
loss=bce,hinge` with a final evaluation, a conditional run and a run whose D wins. `shoot` serves one
folder at a time (each case, and all of outputs/ together) and takes each page from a fresh browser
profile (nothing remembered from an earlier visit: what a new user sees), with TensorBoard's default
chart renderer. A shot can click first (the HParams page's parallel-coordinates view). Each PNG is
re-encoded with a 256-colour palette (Pillow), which keeps a 1400 x 1000 screenshot near 100 KB.
`shoot` also writes the tags of each case's runs into docs/images/tensorboard_tags.json, which
tests/test_watching.py compares with what the code writes now.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

import yaml
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

log = logging.getLogger("tensorboard_screenshots")
ROOT = Path(__file__).resolve().parents[1]
SHORT = ["trainer.log_every=10", "trainer.sample_every=50", "trainer.progress=false", "trainer.threads=1"]
FID = ["trainer.eval_samples=500"]
SWEEP = ["optim.lr=1e-4,1e-3", "loss=bce,hinge", "trainer.max_steps=200", "trainer.eval_every=50"]
RUNS = {  # the cases, each told apart by its command's overrides (.hydra/overrides.yaml)
    "run": ["trainer.max_steps=300", "trainer.eval_every=50", *FID, *SHORT],
    "sweep": ["-m", *SWEEP, *FID, "trainer.final_eval_samples=1000", *SHORT],
    "conditional": ["model.conditional=true", "trainer.max_steps=200", *SHORT],
    # G frozen in practice (learning rate 1e-9) while D learns: D wins within 100 steps
    "d_won": ["optim.lr=1e-9", "optim.lr_d=2e-3", "trainer.max_steps=200", "trainer.d_won_window=50", *SHORT],
}
MANIFEST = "tensorboard_tags.json"  # beside the PNGs: the tags of the runs shown (tests/test_watching.py reads it)


@dataclasses.dataclass
class Shot:
    name: str  # docs/images/NAME.png
    logdir: str  # which folder is served: a key of RUNS, or "outputs" for all of them
    page: str  # the URL fragment of a TensorBoard page
    size: tuple[int, int] = (1400, 1000)
    click: Optional[str] = None  # text of a control to click before the shot


SHOTS = [
    Shot("run_timeseries", "run", "timeseries"),
    Shot("run_timeseries_1920", "run", "timeseries", (1920, 1080)),
    Shot("run_text", "run", "text"),
    Shot("sweep_timeseries", "sweep", "timeseries"),
    Shot("sweep_hparams", "sweep", "hparams"),
    Shot("sweep_parallel", "sweep", "hparams", click="PARALLEL COORDINATES VIEW"),
    Shot("conditional_images", "conditional", "images"),
    Shot("d_won_timeseries", "d_won", "timeseries"),
    Shot("d_won_text", "d_won", "text"),
    Shot("outputs_timeseries", "outputs", "timeseries"),
    Shot("outputs_hparams", "outputs", "hparams"),
]


def train_runs(folder: Path) -> None:
    """The runs of RUNS, each from `folder` (its outputs/ holds them under Hydra's default names)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, overrides in RUNS.items():
        started = time.monotonic()
        subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides], cwd=folder, check=True)
        log.info("%s: %.0f s", name, time.monotonic() - started)


def run_folder(folder: Path, name: str) -> Path:
    """The folder a case wrote: the newest run (or sweep) under outputs/ made by that case's command."""
    outputs = folder / "outputs"
    if name == "outputs":
        return outputs
    if name == "sweep":
        return max((outputs / "multirun").glob("*/*"), key=lambda p: p.stat().st_mtime)
    chosen = [p for p in outputs.glob("*/*") if overrides_of(p) == RUNS[name]]
    if not chosen:
        raise SystemExit(f"No {name} run under {outputs}: run `{Path(__file__).name} runs {folder}` first")
    return max(chosen, key=lambda p: p.stat().st_mtime)


def overrides_of(run: Path) -> Optional[list[str]]:
    record = run / ".hydra" / "overrides.yaml"
    return yaml.safe_load(record.read_text()) if record.is_file() else None


def tags_of(logdir: Path) -> dict[str, list[str]]:
    """Every scalar, image and text tag the runs under `logdir` wrote (TensorBoard's reader)."""
    found: dict[str, set[str]] = {"scalars": set(), "images": set(), "text": set()}
    logging.getLogger("tensorboard").setLevel(logging.WARNING)  # not a line per events file read
    for tb in {events.parent for events in logdir.rglob("events.out.tfevents.*")}:
        tags = EventAccumulator(str(tb), size_guidance={"scalars": 1, "images": 1, "tensors": 1}).Reload().Tags()
        found["scalars"] |= set(tags["scalars"])
        found["images"] |= set(tags["images"])
        found["text"] |= {tag for tag in tags["tensors"] if not tag.startswith("_hparams_")}  # the plugin's own
    return {kind: sorted(tags) for kind, tags in found.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def event_runs(logdir: Path) -> set[str]:
    """The runs TensorBoard will list: every folder under logdir holding an events file."""
    return {p.parent.relative_to(logdir).as_posix() for p in logdir.rglob("events.out.tfevents.*")}


def serve(logdir: Path, port: int) -> subprocess.Popen:
    """TensorBoard on 127.0.0.1:port, as `tensorboard --logdir` serves it; returns when it lists
    every run under logdir."""
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
         "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    expected, listed, deadline = event_runs(logdir), set(), time.monotonic() + 120
    while time.monotonic() < deadline and not expected <= listed:
        try:
            listed = set(json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5)))
        except OSError:
            pass
        time.sleep(0.5)
    if not expected <= listed:
        server.terminate()
        raise SystemExit(f"TensorBoard listed {sorted(listed)}, not every run of {logdir} ({sorted(expected)})")
    return server


def shoot(folder: Path, out: Path, chromium: str, shots: list[Shot], logdirs: Optional[dict[str, Path]] = None) -> None:
    """Each shot of `shots`, its logdir found under `folder` (or given in `logdirs`)."""
    from playwright.sync_api import sync_playwright  # the screenshots extra: pip install -e '.[screenshots]'

    out.mkdir(parents=True, exist_ok=True)
    if logdirs is None:  # the documented runs: their tags beside their pictures
        cases = {name: tags_of(run_folder(folder, name)) for name in RUNS}
        (out / MANIFEST).write_text(json.dumps({"runs": RUNS, "tags": cases}, indent=1) + "\n")
    logdirs = logdirs or {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])  # root in a container
        for logdir in dict.fromkeys(shot.logdir for shot in shots):
            port = free_port()
            server = serve(logdirs.get(logdir) or run_folder(folder, logdir), port)
            try:
                for shot in (s for s in shots if s.logdir == logdir):
                    context = browser.new_context(viewport={"width": shot.size[0], "height": shot.size[1]})
                    page = context.new_page()  # a fresh profile: nothing remembered from an earlier visit
                    page.goto(f"http://127.0.0.1:{port}/#{shot.page}", wait_until="networkidle")
                    if shot.click:
                        page.get_by_text(shot.click).click()
                    page.wait_for_timeout(6000)  # charts are drawn after the data arrives
                    path = out / f"{shot.name}.png"
                    page.screenshot(path=str(path))
                    context.close()
                    with Image.open(path) as image:  # TensorBoard's flat colours survive a palette
                        image.convert("RGB").quantize(colors=256).save(path, optimize=True)
                    log.info("%s: %d KB", path, path.stat().st_size // 1024)
            finally:
                server.terminate()
                server.wait(timeout=30)
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "what", choices=["runs", "shoot", "page"], help="train the runs, take the screenshots, or one page"
    )
    parser.add_argument(
        "folder", type=Path, help="where the runs are trained (their outputs/ is served); page: the logdir"
    )
    parser.add_argument("name", nargs="?", default="page", help="page: the PNG's name")
    parser.add_argument("--page", default="timeseries", help="page: the URL fragment (timeseries, text, hparams, ...)")
    parser.add_argument("--size", type=int, nargs=2, default=(1400, 1000), metavar=("W", "H"), help="page: window")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--only", nargs="+", choices=[shot.name for shot in SHOTS], help="these shots only")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.what == "runs":
        train_runs(args.folder.resolve())
        return
    if not args.chromium:
        raise SystemExit("No chromium on PATH: apt-get install -y chromium (or give --chromium PATH)")
    if args.what == "page":
        shot = Shot(args.name, "given", args.page, tuple(args.size))
        shoot(args.folder.resolve(), args.out, args.chromium, [shot], {"given": args.folder.resolve()})
        return
    shoot(args.folder.resolve(), args.out, args.chromium, [s for s in SHOTS if not args.only or s.name in args.only])


if __name__ == "__main__":
    main()
