"""Datasets: every dataset as an `ImageSource` of uint8 squares with labels, and its two splits.
In memory (one tensor, a batch is one indexing op) or streamed by DataLoader workers: the same pixels."""

from __future__ import annotations

import logging
import math
import struct
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset
from torchvision.transforms.functional import pil_to_tensor
from torchvision.transforms.v2 import functional as TF

from gan.config import DataConfig, DatasetName
from gan.data.digits import NUM_DIGIT_CLASSES, render_digits
from gan.device import available_cpus
from gan.errors import ConfigError, DataError

log = logging.getLogger(__name__)

IN_MEMORY_LIMIT = 512 * 2**20
HELD_OUT_EVERY = 7  # folders: 1 image in 7 is held out, MNIST's 10k / 70k
_HELD_OUT_SEED_OFFSET = 1_000_003  # generated sets: the held-out split uses seed + this


class EmptySplitError(DataError):
    """A folder too small for 1 in HELD_OUT_EVERY to fall in a split."""


@dataclass
class ImageSet:
    images: Tensor | Dataset
    labels: Tensor
    num_classes: int
    pack: Optional[str] = None  # data=packed: the pack's content hash, which each checkpoint records


def take(images: Tensor | Dataset, index: Tensor) -> Tensor:
    if isinstance(images, Tensor):
        return images[index]
    return torch.stack([images[int(i)] for i in index])


def load_dataset(cfg: DataConfig, train: bool = True, in_memory: Optional[bool] = None) -> ImageSet:
    """`in_memory` overrides `cfg.in_memory` (None: follow it)."""
    started = time.perf_counter()
    source, split = open_source(cfg, train), "training" if train else "held-out"
    pack = source.pack
    if train and cfg.limit:  # the first N images, their labels with them; the held-out split stays whole
        check_limit(cfg, len(source))
        source, split = source.first(cfg.limit), f"training (first {cfg.limit}: data.limit)"
    keep = cfg.in_memory if in_memory is None else in_memory
    nbytes = len(source) * source.channels * source.image_size**2
    if keep is None:
        keep = nbytes <= IN_MEMORY_LIMIT
    images = source.load_all() if keep else source
    size, where = source.image_size, ("in memory" if keep else "streamed by a DataLoader")
    log.info(
        f"data={cfg.name}, {split} split: {len(source)} images of {source.channels}x{size}x{size} "
        f"({nbytes / 1e6:.0f} MB as uint8), {where}, {source.num_classes} classes "
        f"({time.perf_counter() - started:.1f} s)"
    )
    return ImageSet(images, source.labels, source.num_classes, pack)


def check_limit(cfg: DataConfig, size: int) -> None:
    """A run recorded as limit=N must have seen N images."""
    if cfg.limit <= size:
        return
    generated = cfg.name in (DatasetName.digits, DatasetName.stacked)
    more = " (or raise data.num_samples, the size of the generated set)" if generated else ""
    raise ConfigError(
        f"data.limit={cfg.limit} is more than the {size} images in the training split of data={cfg.name}: it would "
        f"train on all {size}. Set data.limit to at most {size}{more}, or to 0 for the whole split."
    )


def open_source(cfg: DataConfig, train: bool = True) -> ImageSource:
    """Arrays are read (digits rendered), files only listed."""
    opener = _OPENERS.get(cfg.name)
    if opener is None:
        raise DataError(
            f"data.name={cfg.name!r} is not a known dataset; choose one of "
            f"{', '.join(_OPENERS)} (the built-in one is 'digits')."
        )
    return opener(cfg, train)


class ImageSource(Dataset):
    """uint8 (C, S, S) images with labels: one by `__getitem__` (workers) or all by `load_all`, the same pixels."""

    pack: Optional[str] = None  # a pack's content hash (open_packed)

    def __init__(self, labels: Tensor, num_classes: int, channels: int, image_size: int):
        self.labels, self.num_classes = labels.long(), num_classes
        self.channels, self.image_size = channels, image_size

    def __len__(self) -> int:
        return self.labels.numel()

    def load_all(self) -> Tensor:
        out = torch.empty(len(self), self.channels, self.image_size, self.image_size, dtype=torch.uint8)
        # Forking workers costs more than it saves on a few hundred small files.
        workers = min(8, available_cpus()) if len(self) >= 1024 else 0
        for i, batch in enumerate(DataLoader(self, batch_size=256, num_workers=workers)):
            out[i * 256 : (i + 1) * 256] = batch  # the last batch may be shorter, and so is the slice
        return out


class ArrayImages(ImageSource):
    def __init__(self, raw: Tensor, labels: Tensor, num_classes: int, channels: int, image_size: int):
        super().__init__(labels, num_classes, channels, image_size)
        self.raw = raw

    def __getitem__(self, index: int) -> Tensor:
        return fit_square(convert_channels(self.raw[index], self.channels), self.image_size)

    def first(self, count: int) -> ArrayImages:
        return ArrayImages(self.raw[:count], self.labels[:count], self.num_classes, self.channels, self.image_size)

    def load_all(self) -> Tensor:
        # each op works per image: a chunk gives exactly the pixels of single calls
        chunks = [fit_square(convert_channels(chunk, self.channels), self.image_size) for chunk in self.raw.split(4096)]
        return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


class ImageFiles(ImageSource):
    def __init__(self, paths: Sequence[Path], labels: Tensor, num_classes: int, channels: int, image_size: int):
        super().__init__(labels, num_classes, channels, image_size)
        self.paths = [str(p) for p in paths]  # str: cheaper than Path to hand to forked workers

    def __getitem__(self, index: int) -> Tensor:
        return read_image(self.paths[index], self.channels, self.image_size)

    def first(self, count: int) -> ImageFiles:
        return ImageFiles(self.paths[:count], self.labels[:count], self.num_classes, self.channels, self.image_size)


class StackedImages(ImageSource):
    def __init__(self, source: Tensor, triples: Tensor, labels: Tensor):
        super().__init__(labels, 1000, 3, source.size(-1))
        self.source, self.triples = source, triples  # (M, 1, S, S) uint8, (N, 3) indices into it

    def __getitem__(self, index: int) -> Tensor:
        return self.source[self.triples[index]].flatten(0, 1)  # (3, 1, S, S) -> (3, S, S)

    def first(self, count: int) -> StackedImages:
        return StackedImages(self.source, self.triples[:count], self.labels[:count])

    def load_all(self) -> Tensor:
        return self.source[self.triples].flatten(1, 2)  # one gather: (N, 3, 1, S, S) -> (N, 3, S, S)


def fit_square(images: Tensor, size: int) -> Tensor:
    """The DCGAN tutorial's Resize + CenterCrop; antialiased as PIL is, so shrinking averages pixels."""
    if images.shape[-2:] == (size, size):
        return images
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
        raise DataError(
            f"{path} is refused: {err} Pillow stops such files (decompression bombs). Remove it, or raise "
            "PIL.Image.MAX_IMAGE_PIXELS in your own launcher if the image is genuine."
        ) from err
    return fit_square(pixels, size)


_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_CIFAR_FILES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta")


def _open_mnist_like(cfg: DataConfig, train: bool, kind: type[datasets.MNIST], download_size: str) -> ArrayImages:
    folder = _root(cfg) / kind.__name__ / "raw"  # torchvision's layout: ROOT/MNIST/raw
    missing = [name for name in _IDX_FILES if not (folder / name).is_file()]
    if missing and not cfg.download:
        raise DataError(
            f"data={cfg.name}: no {kind.__name__} in {folder} (absolute path {folder.resolve()}). torchvision's "
            f"{kind.__name__} expects the four uncompressed IDX files there: {', '.join(_IDX_FILES)}; "
            f"{_which_missing(missing, _IDX_FILES)}{_gzipped(folder, missing)}. Add data.download=true to fetch them "
            f"there ({download_size}, "
            f"needs internet), or set data.root to the folder that holds {kind.__name__}/raw."
        )
    prefix = "train" if train else "t10k"  # torchvision's file names: the held-out split is MNIST's test split
    image_file, label_file = folder / f"{prefix}-images-idx3-ubyte", folder / f"{prefix}-labels-idx1-ubyte"
    if not missing:  # files a download would fetch are checked by torchvision after it
        for path in (image_file, label_file):
            _check_idx_length(cfg, path)
    dataset = _torchvision(cfg, lambda: kind(cfg.root, train=train, download=cfg.download), folder)
    images, labels = dataset.data, dataset.targets
    split = "training" if train else "test"
    if images.size(0) != labels.numel():  # the two IDX headers count differently: one file is damaged
        raise DataError(
            f"data={cfg.name}: the {split} files disagree: {image_file} holds {images.size(0)} images but "
            f"{label_file} holds {labels.numel()} labels (the IDX headers' counts). One of them is damaged or "
            "from another set: replace both with the official files."
        )
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= 10):
        raise DataError(
            f"data={cfg.name}: the {split} labels file {label_file} holds values from {int(labels.min())} to "
            f"{int(labels.max())}, outside the 10 classes 0-9: it is damaged or not {kind.__name__}'s. "
            "Replace it with the official file."
        )
    return ArrayImages(images.unsqueeze(1), labels, 10, cfg.channels, cfg.image_size)


# IDX type codes (LeCun's format) -> bytes per value: ubyte, byte, short, int, float, double
_IDX_ITEM_BYTES = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}


def _check_idx_length(cfg: DataConfig, path: Path) -> None:
    """Refuse an IDX file whose header is not one of its kind, or not as long as its header says, naming it
    (torchvision does not: it says "invalid literal for int()" or "x should have 3 dimension instead of 2")."""
    ndim = int(path.name.split("-idx")[1][0])  # train-images-idx3-ubyte: 3 sizes (count, height, width)
    with path.open("rb") as file:
        header = file.read(4 + 4 * ndim)
    shape = struct.unpack(f">{ndim}i", header[4:]) if len(header) == 4 + 4 * ndim else (-1,)
    if header[:2] != b"\0\0" or header[2] not in _IDX_ITEM_BYTES or header[3] != ndim or min(shape) < 0:
        raise DataError(
            f"data={cfg.name}: {path} is not an IDX file of {ndim} dimension(s): it should open with a header of "
            f"{4 + 4 * ndim} bytes (0, 0, a type code, {ndim}, then {ndim} sizes), and "
            f"{'it holds only ' + str(len(header)) if len(header) < 4 + 4 * ndim else 'opens ' + header[:4].hex(' ')}. "
            f"Replace it with the official file, or delete {path.parent} and run again with data.download=true."
        )
    expected = len(header) + math.prod(shape) * _IDX_ITEM_BYTES[header[2]]
    actual = path.stat().st_size
    if actual != expected:
        state = "is truncated" if actual < expected else "is longer than its header says"
        raise DataError(
            f"data={cfg.name}: {path} {state}: its header announces {' x '.join(map(str, shape))} values "
            f"({expected} bytes with the header) but the file holds {actual} bytes. Replace it with the official "
            f"file, or delete {path.parent} and run again with data.download=true."
        )


def open_cifar10(cfg: DataConfig, train: bool) -> ArrayImages:
    folder = _root(cfg) / datasets.CIFAR10.base_folder
    missing = [name for name in _CIFAR_FILES if not (folder / name).is_file()]
    if missing and not cfg.download:
        raise DataError(
            f"data=cifar10: no CIFAR-10 in {folder} (absolute path {folder.resolve()}). torchvision's "
            f"CIFAR10 expects the unpacked python version there: {', '.join(_CIFAR_FILES)}; "
            f"{_which_missing(missing, _CIFAR_FILES)}. Add data.download=true to fetch it there "
            "(163 MB, needs internet), or set data.root to the folder that holds cifar-10-batches-py."
        )
    dataset = _torchvision(cfg, lambda: datasets.CIFAR10(cfg.root, train=train, download=cfg.download), folder)
    raw = torch.from_numpy(dataset.data).permute(0, 3, 1, 2).contiguous()  # HWC -> CHW
    return ArrayImages(raw, torch.tensor(dataset.targets), 10, cfg.channels, cfg.image_size)


def _gzipped(folder: Path, missing: Sequence[str]) -> str:
    """The missing files that lie there compressed, as the download leaves them, which torchvision does not read."""
    packed = [f"{name}.gz" for name in missing if (folder / f"{name}.gz").is_file()]
    there = "is there: gunzip it" if len(packed) == 1 else "are there: gunzip them"
    return f" ({', '.join(packed)} {there})" if packed else ""


def _which_missing(missing: Sequence[str], expected: Sequence[str]) -> str:
    return "none of them is there" if len(missing) == len(expected) else f"missing: {', '.join(missing)}"


_LAYOUT = {  # data=NAME ...
    **{name: f"reads its IDX files from data.root/{folder}/raw: set data.root to the folder that holds {folder}/raw"
       for name, folder in ((DatasetName.mnist, "MNIST"), (DatasetName.fashion_mnist, "FashionMNIST"))},
    DatasetName.cifar10: "reads its batches from data.root/cifar-10-batches-py: set data.root to the folder that "
    "holds cifar-10-batches-py",
    DatasetName.folder: "reads the images in or below data.root itself: set data.root to a folder of images",
    DatasetName.celeba: "reads its JPEGs from data.root/celeba/img_align_celeba: set data.root to the folder that "
    "holds celeba",
    DatasetName.packed: "reads data.root/pack.pt: set data.root to the folder a pack was written to",
}  # fmt: skip


def _root(cfg: DataConfig) -> Path:
    root = Path(cfg.root).expanduser()  # as torchvision does with its root
    if root.exists() and not root.is_dir():  # else each opener would report a folder that "does not exist"
        absolute = "" if str(root) == str(root.resolve()) else f" (absolute path {root.resolve()})"
        raise DataError(
            f"data.root={cfg.root!r} is a file{absolute}, not a folder: data={cfg.name} {_LAYOUT[cfg.name]}."
        )
    return root


def _torchvision(cfg: DataConfig, make: Callable[[], Dataset], folder: Path) -> Dataset:
    try:
        return make()
    except (RuntimeError, OSError, ValueError, TypeError, AssertionError, IndexError) as err:
        # torchvision asserts an IDX file's magic number: a bare AssertionError says nothing
        detail = str(err).strip() or f"{type(err).__name__}: a file's header is not what its format requires"
        where = f"data={cfg.name}: the dataset in {folder} (absolute path {folder.resolve()})"
        if cfg.download:
            problem = f"could not be downloaded: {detail} Run again where the machine is online"
        else:
            problem = (
                f"is there but was refused: a checksum or format check failed ({detail}). Delete the folder and "
                "run again with data.download=true"
            )
        raise DataError(f"{where} {problem}, or copy the official files there.") from err


def open_folder(cfg: DataConfig, train: bool) -> ImageFiles:
    remedy = (
        "Set data.root to a folder of images, flat or with one subfolder per class; there is nothing to download "
        "for data=folder."
    )
    return _image_folder(_root(cfg), cfg, train, remedy)


def open_celeba(cfg: DataConfig, train: bool) -> ImageFiles:
    folder = _root(cfg) / datasets.CelebA.base_folder
    if cfg.download and not (folder / "img_align_celeba").is_dir():
        _torchvision(cfg, lambda: datasets.CelebA(cfg.root, split="all", target_type=[], download=True), folder)
    remedy = (
        "Expected CelebA's 202,599 aligned-and-cropped JPEGs in img_align_celeba/ there. Add data.download=true to "
        "fetch them with torchvision's CelebA (1.4 GB from Google Drive; needs internet and `pip install gdown`), or "
        "unzip img_align_celeba.zip there by hand."
    )
    return _image_folder(folder, cfg, train, remedy)


def _image_folder(root: Path, cfg: DataConfig, train: bool, remedy: str) -> ImageFiles:
    where = f"{root} (absolute path {root.resolve()})"
    if root.exists() and not root.is_dir():
        raise DataError(f"data={cfg.name}: {where} is a file, not a folder. {remedy}")
    if not root.is_dir():
        raise DataError(f"data={cfg.name}: the folder {where} does not exist. {remedy}")
    paths, labels, num_classes = list_images(root)
    if not paths:
        raise DataError(
            f"data={cfg.name}: the folder {where} holds no image files "
            f"({' '.join(IMG_EXTENSIONS)}), in it or below it. {remedy}"
        )
    keep = [i for i, path in enumerate(paths) if is_held_out(path.relative_to(root)) != train]
    if not keep:
        raise EmptySplitError(
            f"data={cfg.name}: none of the {len(paths)} images in {where} falls in the "
            f"{'training' if train else 'held-out'} split (1 in {HELD_OUT_EVERY} is held "
            "out, by a hash of its path). Add images."
        )
    return ImageFiles([paths[i] for i in keep], torch.tensor(labels)[keep], num_classes, cfg.channels, cfg.image_size)


def list_images(root: Path) -> tuple[list[Path], list[int], int]:
    """(paths, labels, classes): folders as classes (ImageFolder) when `root` holds only folders, else one."""
    entries = [p for p in root.iterdir() if not p.name.startswith(".") and p.name != CLASSIFIER_CACHE]
    if any(p.is_dir() for p in entries) and not any(_is_image(p) for p in entries):
        # ImageFolder's listing, walked once; a folder without an image is no class
        folders = sorted(p.name for p in entries if p.is_dir())
        samples = make_dataset(str(root), {name: i for i, name in enumerate(folders)}, IMG_EXTENSIONS, allow_empty=True)
        found = sorted({label for _, label in samples})  # folder indices, in the folders' order
        label_of = {folder: label for label, folder in enumerate(found)}
        return [Path(p) for p, _ in samples], [label_of[c] for _, c in samples], len(found)
    images = (p for p in root.rglob("*") if _is_image(p))
    paths = sorted(p for p in images if not any(part.startswith(".") for part in p.relative_to(root).parts))
    return paths, [0] * len(paths), 1


# under data.root; for data=folder never a class
CLASSIFIER_CACHE = "classifiers"


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMG_EXTENSIONS and path.is_file()


def is_held_out(relative: Path) -> bool:
    """A hash of the path: the same on every machine, and adding images never moves the others."""
    return zlib.crc32(relative.as_posix().encode()) % HELD_OUT_EVERY == 0


def generated_split(cfg: DataConfig, train: bool) -> tuple[int, int]:
    """(count, seed): the held-out split, a sixth of the size, uses another seed, so none of it is in training."""
    return (cfg.num_samples, cfg.seed) if train else (max(cfg.num_samples // 6, 1), cfg.seed + _HELD_OUT_SEED_OFFSET)


def open_digits(cfg: DataConfig, train: bool) -> ArrayImages:
    count, seed = generated_split(cfg, train)
    images, labels = render_digits(count, cfg.image_size, seed)
    return ArrayImages(images, labels, NUM_DIGIT_CLASSES, cfg.channels, cfg.image_size)


def open_stacked(cfg: DataConfig, train: bool) -> StackedImages:
    """Stacked-MNIST (Metz et al. 2017): three uniform draws of `data.source` as R, G, B; 1000 modes."""
    try:  # the source split in memory, grayscale, at the target size; digits renders num_samples
        # limit=0: data.limit counts stacked images, not the source images they are drawn from
        source = load_dataset(replace(cfg, name=cfg.source, channels=1, limit=0), train, in_memory=True)
    except DataError as err:
        raise DataError(f"data=stacked reads its images from data.source={cfg.source}: {err}") from err
    count, seed = generated_split(cfg, train)
    triples = torch.randint(0, source.labels.numel(), (count, 3), generator=torch.Generator().manual_seed(seed))
    digits = source.labels[triples]  # (count, 3): the class of the red, green and blue image
    return StackedImages(source.images, triples, digits[:, 0] * 100 + digits[:, 1] * 10 + digits[:, 2])


PACK_FILE = "pack.pt"  # in data.root, for data=packed: written by gan/data/pack.py
PACK_FORMAT = 2  # 2: the content hash


def open_packed(cfg: DataConfig, train: bool) -> ArrayImages:
    """A pack (gan/data/pack.py): its uint8 images memory-mapped, already at their size: nothing is decoded."""
    file = _root(cfg) / PACK_FILE
    if not file.is_file():
        raise DataError(
            f"data=packed: no pack in {cfg.root} ({file} is missing). Write one with `python -m gan.data.pack "
            f"{cfg.root} data=NAME ...` (the training data's own overrides), or set data.root to a pack's folder."
        )
    try:
        if file.stat().st_size == 0:
            raise ValueError("it is empty, 0 bytes")
        pack = torch.load(file, mmap=True, weights_only=True)
        if not isinstance(pack, dict) or not {"format", "settings", "num_classes", "train", "held_out"} <= set(pack):
            raise ValueError(f"it holds {sorted(pack) if isinstance(pack, dict) else type(pack).__name__}, not a pack")
        split, content = pack["train" if train else "held_out"], pack.get("content")
        images, labels, num_classes = split["images"], split["labels"], int(pack["num_classes"])
        if pack["format"] != PACK_FORMAT or images.dtype != torch.uint8 or images.size(0) != labels.numel():
            raise ValueError("its format, dtype or counts are not a pack's")
        settings = pack["settings"] if isinstance(pack["settings"], dict) else {}
        size, channels, name = (settings.get(key) for key in ("image_size", "channels", "name"))
        if not (type(size) is type(channels) is int and isinstance(name, str) and isinstance(content, str)):
            raise ValueError(f"its settings or content hash are damaged: {str(pack['settings'])[:80]}")
    except Exception as err:  # unreadable, cut short, damaged, or another file named pack.pt
        raise DataError(f"data=packed: {file} cannot be read as a pack ({err}). Write it again.") from err
    if (size, channels) != (cfg.image_size, cfg.channels):
        raise ConfigError(
            f"data.image_size={cfg.image_size} data.channels={cfg.channels}, but {file} holds images packed at "
            f"{size} px with {channels} channel(s) (from data={name}). Set "
            f"data.image_size={size} data.channels={channels}, or pack again at the size you want."
        )
    source = ArrayImages(images, labels, num_classes, cfg.channels, cfg.image_size)
    source.pack = content
    return source


_OPENERS: dict[DatasetName, Callable[[DataConfig, bool], ImageSource]] = {
    DatasetName.digits: open_digits,
    DatasetName.mnist: lambda cfg, train: _open_mnist_like(cfg, train, datasets.MNIST, "about 12 MB"),
    DatasetName.fashion_mnist: lambda cfg, train: _open_mnist_like(cfg, train, datasets.FashionMNIST, "about 30 MB"),
    DatasetName.cifar10: open_cifar10,
    DatasetName.folder: open_folder,
    DatasetName.celeba: open_celeba,
    DatasetName.stacked: open_stacked,
    DatasetName.packed: open_packed,
}
