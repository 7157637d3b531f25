"""How fast each data path feeds the loop: img/s of float batches out of BatchStream, no training.

    python scripts/bench_data.py [--fashion-root DIR] [--seconds 3] [--workers 0 1 2]

Writes MNIST-like PNGs (28x28 gray) and CelebA-like JPEGs (178x218 RGB) into a temporary folder,
then times, for each: the one-off preprocessing into memory (decode, resize, centre-crop), batches
from that in-memory tensor (no DataLoader), and batches streamed by a DataLoader with 0..N workers
that decode and resize per batch. The JPEGs are also packed once (gan/data/pack.py, data=packed) and
timed from the pack: read into memory, and streamed from its memory-mapped arrays by the same
DataLoader, which then decodes nothing. With --fashion-root (a folder holding FashionMNIST/raw) the real
Fashion-MNIST IDX arrays are timed the same way. Prints one table; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: import gan from the repo

from gan.config import DataConfig  # noqa: E402
from gan.data import BatchStream, load_dataset, render_digits  # noqa: E402
from gan.data.pack import write_pack  # noqa: E402
from gan.errors import UserError  # noqa: E402

CPU = torch.device("cpu")


def write_digit_pngs(folder: Path, count: int) -> None:
    """MNIST-like files: rendered digits at 28x28, one PNG each."""
    images, _ = render_digits(count, 28, seed=0)
    folder.mkdir(parents=True)
    for i, image in enumerate(images):
        Image.fromarray(image[0].numpy(), "L").save(folder / f"{i:05d}.png")


def write_face_jpegs(folder: Path, count: int) -> None:
    """CelebA-like files: smooth 178x218 RGB images (upscaled noise plus grain), JPEG quality 90."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        coarse = Image.fromarray(rng.integers(0, 256, (28, 23, 3), dtype=np.uint8))
        coarse = coarse.resize((178, 218), Image.BICUBIC)
        grain = rng.integers(-8, 9, (218, 178, 3))
        pixels = (np.asarray(coarse).astype(np.int16) + grain).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:06d}.jpg", quality=90)


def images_per_second(images, workers: int, seconds: float, batch_size: int = 128) -> float:
    """Float batches per second out of a BatchStream, after two warm-up batches (worker start)."""
    stream = BatchStream(images, batch_size, seed=0, device=CPU, num_workers=workers)
    next(stream), next(stream)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        count += next(stream).size(0)
    return count / (time.perf_counter() - start)


def bench(label: str, cfg: DataConfig, workers: list[int], seconds: float, packed_s: float = 0.0) -> list[tuple]:
    """`packed_s`: the one-off packing that made cfg's pack (data=packed), shown with its read time."""
    rows = []
    start = time.perf_counter()
    in_memory = load_dataset(cfg, in_memory=True).images
    load_s = time.perf_counter() - start
    n = in_memory.size(0)
    once = f"packed in {packed_s:.1f} s once, read in {load_s:.2f} s" if packed_s else f"{load_s:.1f} s once"
    rows.append(
        (
            label,
            n,
            cfg.image_size,
            "in memory (indexing)",
            0,
            images_per_second(in_memory, 0, seconds),
            f"{once} ({n / (packed_s or load_s):,.0f} img/s)",
        )
    )
    streamed = load_dataset(cfg, in_memory=False).images
    path = "streamed from the pack" if packed_s else "streamed (DataLoader)"
    for w in workers:
        rows.append((label, n, cfg.image_size, path, w, images_per_second(streamed, w, seconds), ""))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fashion-root", help="a folder holding FashionMNIST/raw (optional)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timing window per row")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    # 1 thread: on a 2-core machine where another process holds a core, two OpenMP threads collapse
    # (OpenMP's threads spin while they wait for each other); the in-memory path then reads 20x slower.
    parser.add_argument("--threads", type=int, default=1, help="torch threads; 0 keeps torch's default")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        digits, faces = Path(tmp) / "digits", Path(tmp) / "faces"
        write_digit_pngs(digits, 4000)
        write_face_jpegs(faces, 1500)
        rows += bench(
            "PNG 28x28 gray",
            DataConfig(name="folder", root=str(digits), image_size=32, channels=1),
            args.workers,
            args.seconds,
        )
        jpegs = DataConfig(name="folder", root=str(faces), image_size=64, channels=3)
        rows += bench("JPEG 178x218 RGB", jpegs, args.workers, args.seconds)
        start = time.perf_counter()
        write_pack(jpegs, Path(tmp) / "faces-64")
        packed_s = time.perf_counter() - start
        packed = DataConfig(name="packed", root=str(Path(tmp) / "faces-64"), image_size=64, channels=3)
        rows += bench("JPEG packed", packed, args.workers, args.seconds, packed_s)
    if args.fashion_root:
        rows += bench(
            "Fashion-MNIST IDX",
            DataConfig(name="fashion_mnist", root=args.fashion_root, image_size=32),
            args.workers,
            args.seconds,
        )
    print(
        f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, batch 128, CPU device"
    )
    print(
        f"| {'data':<18} | {'images':>6} | {'px':>3} | {'path':<23} | {'workers':>7} | {'img/s':>9} | preprocessing |"
    )
    print(f"|{'-' * 20}|{'-' * 8}|{'-' * 5}|{'-' * 25}|{'-' * 9}|{'-' * 11}|---------------|")
    for label, n, px, path, w, rate, load in rows:
        print(f"| {label:<18} | {n:>6} | {px:>3} | {path:<23} | {w:>7} | {rate:>9,.0f} | {load} |")


if __name__ == "__main__":
    try:
        main()
    except UserError as err:  # a --fashion-root without FashionMNIST: the data loader's paragraph, not a traceback
        print(f"bench_data: {err}", file=sys.stderr)
        raise SystemExit(2) from None
