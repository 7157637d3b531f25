"""Screenshots of TensorBoard as a person first sees it: serve a log directory on loopback, open
its pages in headless Chromium, and save PNGs (for docs/watching.md and README).

Chromium comes from the Debian/Ubuntu package, no Python package needed:

    apt-get install -y chromium        # the binary is /usr/bin/chromium

The pictures in docs/images/ were taken of these runs (each a few minutes on a 2-core CPU):

    python train.py trainer.max_steps=300 trainer.log_every=10 trainer.sample_every=50 hydra.run.dir=/tmp/watch/run
    python train.py -m optim.lr=1e-4,4e-4 trainer.max_steps=300 trainer.log_every=10 trainer.sample_every=50 \\
        hydra.sweep.dir=/tmp/watch/sweep
    python train.py trainer.max_steps=300 trainer.log_every=10 trainer.sample_every=50 trainer.eval_every=50 \\
        hydra.run.dir=/tmp/watch/quality
    python scripts/tensorboard_screenshots.py /tmp/watch/run --prefix run --pages timeseries --height 1700
    python scripts/tensorboard_screenshots.py /tmp/watch/run --prefix run --pages scalars
    python scripts/tensorboard_screenshots.py /tmp/watch/quality --prefix quality --pages timeseries --height 1700
    python scripts/tensorboard_screenshots.py /tmp/watch/sweep --prefix sweep --pages hparams --width 2350 --height 600
    python scripts/tensorboard_screenshots.py /tmp/watch/sweep --prefix sweep --pages timeseries

Each page is one `chromium --headless --screenshot` of a fresh profile (nothing remembered from an
earlier visit: what a new user sees), with a virtual-time budget: Chromium runs the page's timers
and requests until that much page time has passed, so TensorBoard (a JavaScript app that fetches
its data after loading) has drawn its charts when the picture is taken. The PNGs are re-encoded
with a 256-colour palette (Pillow), which keeps a 1400 x 1000 screenshot near 100 KB.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from PIL import Image

log = logging.getLogger("tensorboard_screenshots")
ROOT = Path(__file__).resolve().parents[1]
# TensorBoard's pages, by the URL fragment that opens each one
PAGES = ("timeseries", "scalars", "images", "hparams", "text", "custom_scalars")
# flags for a quiet, reproducible headless Chromium on a machine without a display or a GPU
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # running as root in a container
    "--disable-gpu",
    "--hide-scrollbars",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def event_runs(logdir: Path) -> set[str]:
    """The runs TensorBoard will list: every folder under logdir holding an events file."""
    return {p.parent.relative_to(logdir).as_posix() for p in logdir.rglob("events.out.tfevents.*")}


def serve(logdir: Path, port: int) -> subprocess.Popen:
    """TensorBoard on 127.0.0.1:port, loading logdir once (--reload_interval=0: the runs are done);
    returns when it lists every run under logdir."""
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
         "--port", str(port), "--load_fast=false", "--reload_interval=0"],
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


def screenshot(chromium: str, url: str, out: Path, width: int, height: int, budget_ms: int) -> None:
    """One page as a PNG, from a fresh Chromium profile."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        subprocess.run(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={out}",
             f"--window-size={width},{height}", f"--virtual-time-budget={budget_ms}", url],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=180,
        )  # fmt: skip
    # a 256-colour palette: TensorBoard's flat colours survive it, at a third of the bytes
    with Image.open(out) as image:
        image.convert("RGB").quantize(colors=256).save(out, optimize=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logdir", type=Path, help="the folder to serve, as `tensorboard --logdir`")
    parser.add_argument("--pages", nargs="+", default=["timeseries"], choices=PAGES)
    parser.add_argument("--prefix", default="tensorboard", help="files are OUT/PREFIX_PAGE.png")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--budget-ms", type=int, default=15000, help="page time Chromium lets pass before the shot")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not args.chromium:
        raise SystemExit("No chromium on PATH: apt-get install -y chromium (or give --chromium PATH)")
    if not event_runs(args.logdir):
        raise SystemExit(f"No TensorBoard events under {args.logdir}")
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = serve(args.logdir, port)
    try:
        for page in args.pages:
            out = args.out / f"{args.prefix}_{page}.png"
            # forceSVG=true: TensorBoard's own flag for its SVG chart renderer. Its default, WebGL in
            # a worker, draws empty charts in Chromium without a GPU (--disable-gpu), most of the time.
            url = f"http://127.0.0.1:{port}/?forceSVG=true#{page}"
            screenshot(args.chromium, url, out, args.width, args.height, args.budget_ms)
            log.info("%s: %d KB", out, out.stat().st_size // 1024)
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
