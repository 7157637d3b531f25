"""Datasets as `ImageSource`s of uint8 squares with labels, in two splits; held in memory or streamed: same pixels."""

from __future__ import annotations

import copy
import itertools
import logging
import math
import struct
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset
from torchvision.transforms.functional import pil_to_tensor
from torchvision.transforms.v2 import functional as TF

from gan.config import DataConfig, DatasetName
from gan.device import available_cpus
from gan.errors import ConfigError, DataError

log = logging.getLogger(__name__)

IN_MEMORY_LIMIT = 512 * 2**20
HELD_OUT_EVERY = 7  # folders: 1 image in 7 is held out, MNIST's 10k / 70k
_HELD_OUT_SEED = 1_000_003  # generated sets: the held-out split uses data.seed + this
CLASSIFIER_CACHE = "classifiers"  # under data.root; for data=folder never a class
PACK_FILE = "pack.pt"  # in data.root, for data=packed: written by gan/data/pack.py
PACK_FORMAT = 2  # 2: the content hash


class EmptySplitError(DataError):
    """A folder too small for 1 in HELD_OUT_EVERY to fall in a split."""


@dataclass
class ImageSet:
    images: Tensor | Dataset
    labels: Tensor
    num_classes: int
    pack: Optional[str] = None  # data=packed: the pack's content hash, which each checkpoint records


def take(images: Tensor | Dataset, index: Tensor) -> Tensor:
    return images[index] if isinstance(images, Tensor) else torch.stack([images[int(i)] for i in index])


def load_dataset(cfg: DataConfig, train: bool = True, in_memory: Optional[bool] = None) -> ImageSet:
    """`in_memory` overrides `cfg.in_memory`; both None: in memory up to IN_MEMORY_LIMIT bytes."""
    started, source, split = time.perf_counter(), open_source(cfg, train), "training" if train else "held-out"
    if train and cfg.limit:  # the first N images, their labels with them; the held-out split stays whole
        if cfg.limit > len(source):  # a run recorded as limit=N must have seen N images
            more = " (or raise data.num_samples)" if cfg.name in (DatasetName.digits, DatasetName.stacked) else ""
            what = f"more than the {len(source)} images in the training split of data={cfg.name}"
            todo = f"Set data.limit to at most {len(source)}{more}, or to 0 for all"
            raise ConfigError(f"data.limit={cfg.limit} is {what}. {todo}.")
        source, split = copy.copy(source), f"training (first {cfg.limit}: data.limit)"
        source.items, source.labels = source.items[: cfg.limit], source.labels[: cfg.limit]
    nbytes, size = len(source) * source.channels * source.image_size**2, source.image_size
    keep = next(k for k in (in_memory, cfg.in_memory, nbytes <= IN_MEMORY_LIMIT) if k is not None)
    shape = f"{len(source)} images of {source.channels}x{size}x{size} ({nbytes / 1e6:.0f} MB as uint8)"
    took, where = time.perf_counter() - started, "in memory" if keep else "streamed by a DataLoader"
    log.info(f"data={cfg.name}, {split} split: {shape}, {where}, {source.num_classes} classes ({took:.1f} s)")
    return ImageSet(source.load_all() if keep else source, source.labels, source.num_classes, source.pack)


def open_source(cfg: DataConfig, train: bool = True) -> ImageSource:
    """Arrays are read (digits rendered), files only listed."""
    if cfg.name not in _OPENERS:
        raise DataError(f"data.name={cfg.name!r} is not a known dataset; choose one of {', '.join(_OPENERS)}.")
    return _OPENERS[cfg.name](cfg, train)


class ImageSource(Dataset):
    """uint8 (C, S, S) images of `items`: files (read when taken), arrays (N, C, H, W), or indices into `source`."""

    pack: Optional[str] = None  # a pack's content hash (open_packed)
    source: Optional[Tensor] = None  # data=stacked: the gray images `items` index, one a channel

    def __init__(self, items: Sequence | Tensor, labels: Tensor, num_classes: int, channels: int, image_size: int):
        self.items, self.labels, self.num_classes = items, labels.long(), num_classes
        self.channels, self.image_size = channels, image_size

    def __len__(self) -> int:
        return self.labels.numel()

    def __getitem__(self, index: int | Tensor) -> Tensor:
        if not isinstance(self.items, Tensor):
            return read_image(self.items[index], self.channels, self.image_size)
        images = self.items[index] if self.source is None else self.source[self.items[index]].flatten(-4, -3)
        return fit_square(convert_channels(images, self.channels), self.image_size)

    def load_all(self) -> Tensor:
        if isinstance(self.items, Tensor):  # by chunks: each op works per image, the pixels are single calls'
            return torch.cat([self[index] for index in torch.arange(len(self)).split(4096)])
        out = torch.empty(len(self), self.channels, self.image_size, self.image_size, dtype=torch.uint8)
        workers = min(8, available_cpus()) if len(self) >= 1024 else 0  # forking costs more than a few hundred files
        for i, batch in enumerate(DataLoader(self, batch_size=256, num_workers=workers)):
            out[i * 256 : (i + 1) * 256] = batch  # the last batch may be shorter, and so is the slice
        return out


def fit_square(images: Tensor, size: int) -> Tensor:
    """The DCGAN tutorial's Resize + CenterCrop; antialiased as PIL is, so shrinking averages pixels."""
    return TF.center_crop(TF.resize(images, [size], antialias=True), [size, size])


def convert_channels(images: Tensor, channels: int) -> Tensor:
    """Gray repeated into RGB, or RGB to luma in Pillow's fixed-point form, so files and arrays agree."""
    if images.size(-3) == channels:
        return images
    if channels == 3:
        return images.expand(*images.shape[:-3], 3, *images.shape[-2:]).contiguous()
    weights = torch.tensor([19595, 38470, 7471], dtype=torch.int32).view(3, 1, 1)
    luma = (images.int() * weights).sum(-3, keepdim=True, dtype=torch.int32) + 0x8000
    return (luma >> 16).to(torch.uint8)


def read_image(path: str, channels: int, size: int) -> Tensor:
    try:
        with Image.open(path) as image:
            if image.mode.startswith("I;16") or (image.mode == "I" and image.getextrema()[1] > 255):
                image = image.convert("I").point(lambda v: v / 256)  # 16 bits: convert() clips them, near white
            pixels = pil_to_tensor(image.convert("L" if channels == 1 else "RGB"))
    except OSError as err:  # unreadable or truncated file; PIL.UnidentifiedImageError is an OSError
        raise DataError(f"{path} cannot be read as an image ({err}). Remove it or fix it.") from err
    except Image.DecompressionBombError as err:  # a small file that would decode to gigabytes
        message = "(a decompression bomb). Remove it, or raise PIL.Image.MAX_IMAGE_PIXELS in your own launcher"
        raise DataError(f"{path} is refused: {err} {message} if the image is genuine.") from err
    return fit_square(pixels, size)


_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _require_files(cfg: DataConfig, folder: Path, files: Sequence[str], size: str) -> bool:
    missing = [name for name in files if not (folder / name).is_file()]
    if missing and not cfg.download:
        which = "none of them is there" if len(missing) == len(files) else f"missing: {', '.join(missing)}"
        packed = [f"{name}.gz" for name in missing if (folder / f"{name}.gz").is_file()]  # torchvision reads no .gz
        gunzip = f" (gunzip {', '.join(packed)} there)" if packed else ""
        where = f"{folder} (absolute path {folder.resolve()}): torchvision expects {', '.join(files)} there"
        todo = f"Add data.download=true to fetch them ({size}, needs internet), or set data.root to the folder holding"
        raise DataError(
            f"data={cfg.name}: no dataset in {where}; {which}{gunzip}. {todo} {folder.relative_to(_root(cfg))}."
        )
    return not missing


def _open_mnist_like(cfg: DataConfig, train: bool, kind: type[datasets.MNIST], size: str) -> ImageSource:
    folder = _root(cfg) / kind.__name__ / "raw"  # torchvision's layout: ROOT/MNIST/raw
    image_file, label_file = (folder / name for name in (_IDX_FILES[:2] if train else _IDX_FILES[2:]))  # t10k: held out
    there = _require_files(cfg, folder, _IDX_FILES, size)  # files a download fetches are checked by torchvision
    for path, ndim in ((image_file, 3), (label_file, 1)) if there else ():  # a bad header or length, named
        with path.open("rb") as file:  # (torchvision says "invalid literal for int()" or "x should have 3 dim...")
            header = file.read(4 + 4 * ndim)  # IDX: 0, 0, a type code, ndim, then ndim sizes (count, height, width)
        shape = struct.unpack(f">{ndim}i", header[4:]) if len(header) == 4 + 4 * ndim else (-1,)
        remedy = f"Replace it with the official file, or delete {folder} and run again with data.download=true."
        if header[:3] != b"\0\0\x08" or header[3] != ndim or min(shape) < 0:  # 8: unsigned bytes, all torchvision reads
            what = f"{len(header)}-byte header {header.hex(' ')} is not 0, 0, 8 (unsigned bytes), {ndim}, {ndim} sizes"
            raise DataError(f"data={cfg.name}: {path} is not an IDX file of {ndim} dimension(s): its {what}. {remedy}")
        expected, actual = len(header) + math.prod(shape), path.stat().st_size
        if actual != expected:
            state = "is truncated" if actual < expected else "is longer than its header says"
            raise DataError(f"data={cfg.name}: {path} {state}: {actual} bytes, its header says {expected}. {remedy}")
    dataset = _torchvision(cfg, lambda: kind(cfg.root, train=train, download=cfg.download), folder)
    images, labels = dataset.data, dataset.targets
    if images.size(0) != labels.numel():  # the two IDX headers count differently: one file is damaged
        raise DataError(f"data={cfg.name}: {image_file} holds {images.size(0)} images but {label_file} holds "
                        f"{labels.numel()} labels: one is damaged. Replace both with the official files.")  # fmt: skip
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= 10):
        values = f"from {int(labels.min())} to {int(labels.max())}, outside the 10 classes 0-9"
        raise DataError(f"data={cfg.name}: the labels file {label_file} holds values {values}. Replace it.")
    return ImageSource(images.unsqueeze(1), labels, 10, cfg.channels, cfg.image_size)


def open_cifar10(cfg: DataConfig, train: bool) -> ImageSource:
    folder = _root(cfg) / datasets.CIFAR10.base_folder
    _require_files(cfg, folder, [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"], "163 MB")
    dataset = _torchvision(cfg, lambda: datasets.CIFAR10(cfg.root, train=train, download=cfg.download), folder)
    raw = torch.from_numpy(dataset.data).permute(0, 3, 1, 2).contiguous()  # HWC -> CHW
    return ImageSource(raw, torch.tensor(dataset.targets), 10, cfg.channels, cfg.image_size)


def _root(cfg: DataConfig) -> Path:
    root = Path(cfg.root).expanduser()  # as torchvision does with its root
    if root.is_file():  # else each opener would report a folder that "does not exist"
        why = f"not a folder: data={cfg.name} reads a folder. Set data.root to the folder that holds the dataset"
        raise DataError(f"data.root={cfg.root!r} is a file (absolute path {root.resolve()}), {why}.")
    return root


def _torchvision(cfg: DataConfig, make: Callable[[], Dataset], folder: Path) -> Dataset:
    try:
        return make()
    except (RuntimeError, OSError, ValueError, TypeError, AssertionError, IndexError) as err:
        # torchvision asserts an IDX file's magic number: a bare AssertionError says nothing
        detail = str(err).strip() or f"{type(err).__name__}: a file's header is not what its format requires"
        where = f"data={cfg.name}: the dataset in {folder} (absolute path {folder.resolve()})"
        problem = f"could not be downloaded: {detail} Run again where the machine is online"
        if not cfg.download:
            problem = f"was refused: a checksum or format check failed ({detail}). Run again with data.download=true"
        raise DataError(f"{where} {problem}, or copy the official files there.") from err


def open_folder(cfg: DataConfig, train: bool) -> ImageSource:
    """data=folder: the images in data.root; data=celeba: CelebA's aligned JPEGs, in torchvision's folder there."""
    root, remedy = _root(cfg), "Set data.root to a folder of images, flat or a subfolder a class: it downloads nothing."
    if cfg.name == DatasetName.celeba:
        root = root / datasets.CelebA.base_folder
        if cfg.download and not (root / "img_align_celeba").is_dir():
            _torchvision(cfg, lambda: datasets.CelebA(cfg.root, split="all", target_type=[], download=True), root)
        fetch = "data.download=true fetches them (1.4 GB from Google Drive; needs internet and `pip install gdown`)"
        remedy = f"Expected CelebA's aligned JPEGs in img_align_celeba/ there: {fetch}, or unzip img_align_celeba.zip."
    where = f"{root} (absolute path {root.resolve()})"
    if not root.is_dir():
        state = "is a file, not a folder" if root.exists() else "does not exist"
        raise DataError(f"data={cfg.name}: {where} {state}. {remedy}")
    paths, labels, num_classes = list_images(root)
    if not paths:
        raise DataError(f"data={cfg.name}: {where} holds no image files ({' '.join(IMG_EXTENSIONS)}). {remedy}")
    keep = [i for i, path in enumerate(paths) if is_held_out(path.relative_to(root)) != train]
    if not keep:
        split = f"the {'training' if train else 'held-out'} split (1 in {HELD_OUT_EVERY} is held out by a path hash)"
        raise EmptySplitError(f"data={cfg.name}: none of the {len(paths)} images in {where} is in {split}. Add more.")
    files = [str(paths[i]) for i in keep]  # str: cheaper than Path to hand to forked workers
    return ImageSource(files, torch.tensor(labels)[keep], num_classes, cfg.channels, cfg.image_size)


def list_images(root: Path) -> tuple[list[Path], list[int], int]:
    """(paths, labels, classes): folders as classes (ImageFolder) when `root` holds only folders, else one."""
    entries = [p for p in root.iterdir() if not p.name.startswith(".") and p.name != CLASSIFIER_CACHE]
    is_image = [p.suffix.lower() in IMG_EXTENSIONS and p.is_file() for p in entries]
    if any(p.is_dir() for p in entries) and not any(is_image):
        folders = sorted(p.name for p in entries if p.is_dir())  # ImageFolder's listing; no image, no class
        samples = make_dataset(str(root), {name: i for i, name in enumerate(folders)}, IMG_EXTENSIONS, allow_empty=True)
        label_of = {folder: label for label, folder in enumerate(sorted({c for _, c in samples}))}
        return [Path(p) for p, _ in samples], [label_of[c] for _, c in samples], len(label_of)
    images = (p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS)
    paths = sorted(p for p in images if not any(part.startswith(".") for part in p.relative_to(root).parts))
    return paths, [0] * len(paths), 1


def is_held_out(relative: Path) -> bool:  # by a hash of the path: alike on every machine; new images move no other
    return zlib.crc32(relative.as_posix().encode()) % HELD_OUT_EVERY == 0


def open_generated(cfg: DataConfig, train: bool) -> ImageSource:
    """data=digits, rendered, or data=stacked (Stacked-MNIST, Metz et al. 2017): three uniform draws of `data.source`
    as R, G, B, 1000 modes. The held-out split, a sixth of the size, uses another seed: none of it is in training."""
    count, seed = (cfg.num_samples, cfg.seed) if train else (max(cfg.num_samples // 6, 1), cfg.seed + _HELD_OUT_SEED)
    if cfg.name == DatasetName.digits:
        return ImageSource(*render_digits(count, cfg.image_size, seed), NUM_DIGIT_CLASSES, cfg.channels, cfg.image_size)
    try:  # the source split in memory, grayscale, at the target size (limit=0: data.limit counts stacked images)
        source = load_dataset(replace(cfg, name=cfg.source, channels=1, limit=0), train, in_memory=True)
    except DataError as err:
        raise DataError(f"data=stacked reads its images from data.source={cfg.source}: {err}") from err
    triples = torch.randint(0, source.labels.numel(), (count, 3), generator=torch.Generator().manual_seed(seed))
    digits = source.labels[triples]  # (count, 3): the class of the red, green and blue image
    stacked = ImageSource(triples, digits[:, 0] * 100 + digits[:, 1] * 10 + digits[:, 2], 1000, 3, cfg.image_size)
    stacked.source = source.images
    return stacked


def open_packed(cfg: DataConfig, train: bool) -> ImageSource:
    """A pack (gan/data/pack.py): its uint8 images memory-mapped, already at their size: nothing is decoded."""
    file = _root(cfg) / PACK_FILE
    if not file.is_file():
        where = f"no pack in {cfg.root} ({file} is missing)"
        write = f"`python -m gan.data.pack {cfg.root} data=NAME ...` (the training data's own overrides)"
        raise DataError(f"data=packed: {where}. Write one with {write}, or set data.root to a pack's folder.")
    try:
        if file.stat().st_size == 0:
            raise ValueError("it is empty, 0 bytes")
        pack = torch.load(file, mmap=True, weights_only=True)
        if not isinstance(pack, dict) or not {"format", "settings", "num_classes", "train", "held_out"} <= set(pack):
            raise ValueError(f"it holds {sorted(pack) if isinstance(pack, dict) else type(pack).__name__}, not a pack")
        images, labels = (pack["train" if train else "held_out"][key] for key in ("images", "labels"))
        if pack["format"] != PACK_FORMAT or images.dtype != torch.uint8 or images.size(0) != labels.numel():
            raise ValueError("its format, dtype or counts are not a pack's")
        settings = pack["settings"] if isinstance(pack["settings"], dict) else {}
        size, channels, name = (settings.get(key) for key in ("image_size", "channels", "name"))
        if not (type(size) is type(channels) is int and isinstance(name, str) and isinstance(pack.get("content"), str)):
            raise ValueError(f"its settings or content hash are damaged: {str(pack['settings'])[:80]}")
    except Exception as err:  # unreadable, cut short, damaged, or another file named pack.pt
        raise DataError(f"data=packed: {file} cannot be read as a pack ({err}). Write it again.") from err
    if (size, channels) != (cfg.image_size, cfg.channels):
        packed = f"{file} holds images packed at {size} px with {channels} channel(s) (from data={name})"
        todo = f"Set data.image_size={size} data.channels={channels}, or pack again at the size you want"
        raise ConfigError(f"data.image_size={cfg.image_size} data.channels={cfg.channels}, but {packed}. {todo}.")
    source = ImageSource(images, labels, int(pack["num_classes"]), cfg.channels, cfg.image_size)
    source.pack = pack["content"]
    return source


# the built-in dataset: digits 0-9 rendered with Pillow's bundled font, then jittered; no download --------------
NUM_DIGIT_CLASSES = 10
_STROKES = (1, 2, 3)  # extra stroke width in template pixels: thin, regular, bold


def render_digits(num_samples: int, image_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """A pure function of the seed: each digit drawn once per stroke, then a random affine, blur and noise."""
    size = max(64, 2 * image_size)  # the templates' side
    try:
        font = ImageFont.load_default(size=int(size * 0.8))
    except ImportError as err:  # Pillow built without FreeType has only a fixed bitmap font
        raise DataError("data=digits needs Pillow with FreeType support (the PyPI wheels have it).") from err
    glyphs = []
    for digit, stroke in itertools.product(range(NUM_DIGIT_CLASSES), _STROKES):
        canvas = Image.new("L", (size, size), 0)
        style = {"fill": 255, "font": font, "anchor": "mm", "stroke_fill": 255, "stroke_width": stroke * size // 64}
        ImageDraw.Draw(canvas).text((size / 2, size / 2), str(digit), **style)
        glyphs.append(torch.frombuffer(bytearray(canvas.tobytes()), dtype=torch.uint8).view(size, size))
    templates = torch.stack(glyphs).unsqueeze(1).float() / 255  # (10 * strokes, 1, T, T) in [0, 1]
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, NUM_DIGIT_CLASSES, (num_samples,), generator=gen)
    picks = labels * len(_STROKES) + torch.randint(0, len(_STROKES), (num_samples,), generator=gen)  # the templates
    return torch.cat([_jitter(templates[index], image_size, gen) for index in picks.split(4096)]), labels


def _jitter(templates: Tensor, image_size: int, gen: torch.Generator) -> Tensor:
    n = templates.size(0)

    def uniform(low: float, high: float) -> Tensor:
        return torch.empty(n).uniform_(low, high, generator=gen)

    angle, shear = uniform(-0.25, 0.25), uniform(-0.25, 0.25)  # radians, about +-15 degrees; a shear
    scale_x, scale_y = uniform(0.8, 1.05), uniform(0.72, 0.92)  # <1 zooms in, >1 out
    cos, sin = torch.cos(angle), torch.sin(angle)
    row_x = torch.stack([cos * scale_x, (-sin + shear) * scale_y, uniform(-0.12, 0.12)], dim=1)
    row_y = torch.stack([sin * scale_x, cos * scale_y, uniform(-0.12, 0.12)], dim=1)
    theta = torch.stack([row_x, row_y], dim=1)  # (N, 2, 3): output coordinates -> template coordinates, for affine_grid
    # Sample at twice the size and average-pool: a cheap anti-aliasing filter.
    grid = F.affine_grid(theta, [n, 1, 2 * image_size, 2 * image_size], align_corners=False)
    x = F.avg_pool2d(F.grid_sample(templates, grid, align_corners=False), 2).view(1, n, image_size, image_size)
    # a Gaussian blur of its own sigma per image: a grouped conv over the batch, rows then columns
    sigma = uniform(0.01, 0.7) * image_size / 32
    radius = max(1, math.ceil(2 * float(sigma.max())))
    kernel = torch.exp(-0.5 * (torch.arange(-radius, radius + 1, dtype=x.dtype).view(1, -1) / sigma.view(-1, 1)) ** 2)
    kernel = kernel / kernel.sum(dim=1, keepdim=True)  # (N, 2r+1)
    x = F.conv2d(F.pad(x, (radius, radius, 0, 0), mode="replicate"), kernel.view(n, 1, 1, -1), groups=n)
    x = F.conv2d(F.pad(x, (0, 0, radius, radius), mode="replicate"), kernel.view(n, 1, -1, 1), groups=n)
    x = x.view(n, 1, image_size, image_size) * uniform(0.75, 1.0).view(n, 1, 1, 1)  # ink intensity
    x = x + torch.randn(x.shape, generator=gen) * uniform(0.0, 0.06).view(n, 1, 1, 1)
    return (x.clamp(0, 1) * 255).round().to(torch.uint8)


_OPENERS: dict[DatasetName, Callable[[DataConfig, bool], ImageSource]] = {
    DatasetName.digits: open_generated,
    DatasetName.mnist: lambda cfg, train: _open_mnist_like(cfg, train, datasets.MNIST, "about 12 MB"),
    DatasetName.fashion_mnist: lambda cfg, train: _open_mnist_like(cfg, train, datasets.FashionMNIST, "about 30 MB"),
    DatasetName.cifar10: open_cifar10,
    DatasetName.folder: open_folder,
    DatasetName.celeba: open_folder,
    DatasetName.stacked: open_generated,
    DatasetName.packed: open_packed,
}
