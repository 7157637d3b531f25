"""gan.data on small files in each real format (no download: sockets blocked); damaged data is named, one paragraph."""

import dataclasses
import pickle
import re
import socket
import struct
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
import torchvision.datasets.cifar
from conftest import CONFIG_DIR, compose_config
from omegaconf import OmegaConf
from PIL import Image
from torchvision import transforms

import gan.checkpoint
import gan.data.sources
from gan.config import ClassifierConfig, ConfigError, DataConfig
from gan.data import BatchStream, DataError, is_held_out, load_dataset, open_source, take
from gan.data.pack import main as pack_main
from gan.data.pack import write_pack
from gan.data.sources import CLASSIFIER_CACHE, ImageSource, convert_channels, fit_square, read_image, render_digits
from gan.data.stream import to_unit_range, worker_message
from gan.evaluation.metrics import classifier_key
from gan.training import train

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _no_internet(monkeypatch):
    """Any attempt to open an internet connection fails the test (local sockets still work)."""
    real, inet = socket.socket.connect, (socket.AF_INET, socket.AF_INET6)
    monkeypatch.setattr(socket.socket, "connect", lambda s, a: pytest.fail(str(a)) if s.family in inet else real(s, a))


def write_idx(path: Path, array: np.ndarray) -> None:
    """IDX (LeCun's MNIST format): 0, 0, type 0x08 (uint8), ndim; big-endian int32 sizes; the bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root: Path, folder: str = "MNIST", train: int = 40, test: int = 8) -> list[int]:
    """Top half 100 + 10 label + index % 4, bottom half black; the test split starts at class 5; the train labels."""
    for prefix, count in (("train", train), ("t10k", test)):
        labels, images = (np.arange(count) + (5 if prefix == "t10k" else 0)) % 10, np.zeros((count, 28, 28), np.uint8)
        images[:, :14] = (100 + labels * 10 + np.arange(count) % 4)[:, None, None]
        write_idx(root / folder / "raw" / f"{prefix}-images-idx3-ubyte", images)
        write_idx(root / folder / "raw" / f"{prefix}-labels-idx1-ubyte", labels)
    return [i % 10 for i in range(train)]


def write_cifar(root: Path) -> Path:
    """CIFAR-10's pickled batches of 2 rows of 3072 (R, G, B): image i's top half is (200, 100, i), label i % 10."""
    (folder := root / "cifar-10-batches-py").mkdir(parents=True)
    for b, name in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
        images = np.zeros((2, 3, 32, 32), np.uint8)
        images[:, 0, :16], images[:, 1, :16], images[:, 2, :16] = 200, 100, (2 * b + np.arange(2))[:, None, None]
        batch = {"labels": [(2 * b + i) % 10 for i in range(2)], "data": images.reshape(2, 3072)}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [str(c) for c in range(10)]}))
    return folder


def write_image(path: Path, size: tuple[int, int], mode: str = "RGB", seed: int = 0) -> None:
    """A random image of (width, height) saved by Pillow in the format its suffix names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = (size[1], size[0]) + ((3,) if mode == "RGB" else ())
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8), mode).save(path)


def make_folder(root: Path, count: int = 24) -> Path:
    for i in range(count):
        write_image(root / f"{i:02d}.png", (24 + i, 20), seed=i)
    return root


def cfg_for(name: str, root: Path, **overrides) -> DataConfig:
    return DataConfig(name=name, root=str(root), **overrides)


@pytest.mark.parametrize("size", [16, 32, 64])
def test_digits_are_deterministic_labelled_distinct_and_inked_in_the_middle(size):
    images, labels = render_digits(1000, size, seed=7)
    few, few_labels = render_digits(200, size, seed=7)
    assert all(torch.equal(a, b) for a, b in zip(render_digits(200, size, seed=7), (few, few_labels)))
    assert not torch.equal(render_digits(200, size, seed=8)[0], few) and set(labels.tolist()) == set(range(10))
    assert images.shape == (1000, 1, size, size) and images.dtype == torch.uint8
    mean = images.float().mean(0)[0]
    assert mean[size // 4 : -size // 4, size // 4 : -size // 4].mean() > 3 * mean[0].mean()  # the digit, not noise
    means = torch.stack([images[labels == c].float().mean(0) for c in range(10)]).flatten(1)
    distances = torch.cdist(means, means) * 32 / size  # per 32 x 32 pixels
    assert distances[~torch.eye(10, dtype=torch.bool)].min() > 50  # ten distinct average shapes


@pytest.mark.parametrize("height, width", [(28, 28), (218, 178), (12, 40)])
def test_fit_square_resizes_the_shorter_side_then_crops_the_centre_and_gray_is_pillows_luma(height, width):
    images = torch.zeros(2, 1, height, width, dtype=torch.uint8)
    images[..., height // 2 :, :] = 200  # bottom half bright: the crop keeps the middle rows
    out, same = fit_square(images, 16), torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8)
    assert out.shape == (2, 1, 16, 16) and out.dtype == torch.uint8
    assert out[..., :7, :].max() < 50 and out[..., 9:, :].min() > 150
    assert convert_channels(same, 3) is same and fit_square(same, 16).data_ptr() == same.data_ptr()  # not resampled
    pixels = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8)
    pixels[0, 0] = 255  # white stays 255: the rounding constant must not overflow a byte
    pillow = torch.tensor(np.asarray(Image.fromarray(pixels.numpy()).convert("L")))  # to the byte
    assert torch.equal(convert_channels(pixels.permute(2, 0, 1), 1)[0], pillow)


@pytest.mark.parametrize("name, folder", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_mnist_like_datasets_read_torchvision_layout_resized_and_oriented_and_download_only_if_missing(
    tmp_path, monkeypatch, name, folder
):
    labels, fetch = write_mnist(tmp_path, folder), "download_and_extract_archive"  # with the files there: no download
    monkeypatch.setattr(torchvision.datasets.mnist, fetch, lambda *a, **k: pytest.fail("tried to download"))
    data = load_dataset(cfg_for(name, tmp_path, image_size=32, download=True))
    assert data.images.shape == (40, 1, 32, 32) and data.images.dtype == torch.uint8 and data.num_classes == 10
    values = [100 + c * 10 + i % 4 for i, c in enumerate(labels)]  # in file order, rows as rows
    assert data.images[:, 0, :12].flatten(1).float().mean(1).tolist() == values and data.labels.tolist() == labels
    assert int(data.images[:, 0, -12:].max()) == 0
    assert load_dataset(cfg_for(name, tmp_path), train=False).labels.tolist() == [5, 6, 7, 8, 9, 0, 1, 2]  # t10k files
    rgb = load_dataset(cfg_for(name, tmp_path, channels=3)).images  # grayscale repeated into RGB
    assert rgb.shape == (40, 3, 32, 32) and all(torch.equal(rgb[:, c : c + 1], data.images) for c in range(3))
    offline = mock.Mock(side_effect=RuntimeError("Error downloading train-images-idx3-ubyte.gz"))
    monkeypatch.setattr(torchvision.datasets.MNIST, "download", offline)  # FashionMNIST's too
    with pytest.raises(DataError, match="could not be downloaded.*Error downloading"):
        load_dataset(cfg_for(name, tmp_path / "empty", download=True))


def test_cifar10_reads_the_pickled_batches_as_rgb_planes_and_refuses_wrong_checksums(tmp_path, monkeypatch):
    folder = write_cifar(tmp_path)  # the real layout with the wrong bytes: torchvision's md5 check fails
    with pytest.raises(DataError, match="checksum") as err:
        load_dataset(cfg_for("cifar10", tmp_path, channels=3))
    assert str(folder.resolve()) in str(err.value) and "data.download=true" in str(err.value)
    # torchvision checks each file's md5 against the official archive's, as it just did: only that is replaced
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda path, md5=None: Path(path).is_file())
    data = load_dataset(cfg_for("cifar10", tmp_path, image_size=32, channels=3))
    assert data.images.shape == (10, 3, 32, 32) and data.num_classes == 10 and data.labels.tolist() == list(range(10))
    top = data.images[:, :, :16].flatten(2).float().mean(2)  # (N, 3) mean of each plane's top half
    assert top[:, 0].eq(200).all() and top[:, 1].eq(100).all() and top[:, 2].tolist() == list(range(10))
    assert int(data.images[:, :, 16:].max()) == 0
    assert load_dataset(cfg_for("cifar10", tmp_path, channels=3), train=False).labels.tolist() == [0, 1]  # test_batch
    gray = load_dataset(cfg_for("cifar10", tmp_path, channels=1)).images  # as Pillow converts RGB
    expected = Image.fromarray(np.array([[[200, 100, 7]]], np.uint8)).convert("L").getpixel((0, 0))
    assert gray.shape == (10, 1, 32, 32) and int(gray[7, 0, 0, 0]) == expected


MISSING = [("mnist", "MNIST/raw", "data.download=true"), ("fashion_mnist", "FashionMNIST/raw", "data.download=true"),
           ("cifar10", "cifar-10-batches-py", "data.download=true"), ("celeba", "celeba", "data.download=true"),
           ("folder", "", "downloads nothing")]  # fmt: skip
IMAGELESS = [  # a folder without a usable image (broken.png: an image by its name only)
    ("folder", "", "holds no image files", []),
    ("folder", "", "holds no image files", ["notes.txt", "sub/readme.md"]),
    ("folder", "", "is in the training split", ["readme.txt", "broken.png"]),
]


@pytest.mark.parametrize("name, expected, remedy, files", [(*row, None) for row in MISSING] + IMAGELESS)
def test_a_missing_or_imageless_root_says_where_what_and_how_to_get_it(tmp_path, name, expected, remedy, files):
    root = tmp_path / "nowhere"
    if files is not None:
        root.mkdir()
    for file in files or []:
        (root / file).parent.mkdir(exist_ok=True)
        (root / file).write_text("not an image")
    with pytest.raises(DataError) as err:
        load_dataset(cfg_for(name, root, channels=3))
    message = str(err.value)
    assert str((root / expected).resolve()) in message and remedy in message and f"data={name}" in message


IMAGES, LABELS, T10K = "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte"
NOT_IDX = "{images} is not an IDX file of 3 dimension"  # torchvision: "invalid literal for int() with base 16"...


def damaged_mnist(root: Path, damage: str) -> Path:
    """MNIST IDX files (40 training, 8 test images) whose test labels file is damaged; returns it."""
    write_mnist(root, train=40, test=8)
    labels = root / "MNIST" / "raw" / T10K
    if damage == "truncated":  # the header still counts 8 labels; the file holds 6
        labels.write_bytes(labels.read_bytes()[:-2])
    else:  # labels 5..12: three of them are no digit
        write_idx(labels, np.arange(8) + 5)
    return labels


HELD_OUT_DAMAGE = {"truncated": "is truncated", "out of range": "outside the 10 classes 0-9"}
MNIST_DAMAGE = {
    "a wrong type code": (lambda raw: (raw / IMAGES).write_bytes(b"\0\0\x42\x03" + (raw / IMAGES).read_bytes()[4:]),
                          NOT_IDX),
    "empty": (lambda raw: (raw / IMAGES).write_bytes(b""), NOT_IDX),
    "a header cut short": (lambda raw: (raw / IMAGES).write_bytes(b"\0\0\x08\x03\0\0"), NOT_IDX),
    "2 sizes for 3": (lambda raw: (raw / IMAGES).write_bytes(b"\0\0\x08\x02\0\0\0\x28\0\0\0\x1c"), NOT_IDX),
    "counts that disagree": (lambda raw: write_idx(raw / LABELS, np.arange(30) % 10),
                             rf"{IMAGES} holds 40 images but \S+{LABELS} holds 30"),
    "labels outside 0-9": (lambda raw: write_idx(raw / LABELS, np.arange(40) % 10 + 3), "outside the 10 classes"),
    # a download leaves FILE.gz and unpacks it; torchvision reads no .gz copy alone (what it holds is not looked at)
    "left gzipped": (lambda raw: (raw / IMAGES).rename(raw / f"{IMAGES}.gz"), rf"{IMAGES} \(gunzip {IMAGES}.gz there"),
    "a file missing": (lambda raw: (raw / "t10k-labels-idx1-ubyte").unlink(), "missing: t10k-labels-idx1-ubyte"),
    # a download cut short: the IDX magic and a few bytes; sizes of about 6e20 bytes are damage, not allocated
    "a header announcing more than it holds": (
        lambda raw: [(raw / name).write_bytes(b"\x00\x00\x08\x03" + bytes(range(40))) for name in raw.iterdir()],
        r"{images} is truncated.*data\.download=true"),
    # the held-out split's labels (damaged_mnist, which test_training shares)
    **{f"held-out labels {damage}": (lambda raw, damage=damage: damaged_mnist(raw.parent.parent, damage),
                                     f"{{raw}}/{T10K} .*{says}") for damage, says in HELD_OUT_DAMAGE.items()},
}  # fmt: skip


@pytest.mark.parametrize("damage, message", MNIST_DAMAGE.values(), ids=MNIST_DAMAGE)
def test_a_damaged_or_partial_mnist_is_named_with_what_is_wrong(tmp_path, damage, message):
    write_mnist(tmp_path)
    damage(tmp_path / "MNIST" / "raw")
    held_out = "{raw}" in message  # a damaged test split is found when it is read; the training split stays whole
    message = message.replace("{images}", re.escape(str(tmp_path / "MNIST" / "raw" / IMAGES)))
    with pytest.raises(DataError, match=message.replace("{raw}", re.escape(str(tmp_path / "MNIST" / "raw")))):
        load_dataset(cfg_for("mnist", tmp_path), train=not held_out)
    assert not held_out or len(load_dataset(cfg_for("mnist", tmp_path)).labels) == 40


NO_LOADER = [(dict(name="nosuch"), "data.name"), (dict(name="stacked", source="cifar10", channels=3), "data.source"),
             (dict(name="stacked", channels=1), "data.channels"), (dict(name="folder", download=True), "data.download"),
             (dict(name="digits", download=True), "data.download")]  # fmt: skip


@pytest.mark.parametrize("overrides, key", NO_LOADER)
def test_config_refuses_what_no_loader_can_do(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        DataConfig(**overrides).check()
    if overrides == dict(name="nosuch"):  # unchecked, the loader refuses it too
        with pytest.raises(DataError, match="not a known dataset"):
            load_dataset(DataConfig(**overrides))


@pytest.mark.parametrize("size, channels", [(16, 3), (64, 3), (32, 1)])
def test_image_formats_and_depths_follow_the_dcgan_recipe_and_a_bomb_is_refused(tmp_path, monkeypatch, size, channels):
    # the PyTorch DCGAN tutorial's Resize + CenterCrop on PIL images; ours, antialiased, on tensors: a rounding apart
    for name, shape in {"0.png": (48, 32), "1.jpg": (30, 50), "2.bmp": (178, 218), "3.png": (20, 12)}.items():
        write_image(tmp_path / name, shape, "L" if name.endswith("jpg") else "RGB", seed=int(name[0]))  # a gray JPEG
    data = load_dataset(cfg_for("folder", tmp_path, image_size=size, channels=channels), train=True)
    held = load_dataset(cfg_for("folder", tmp_path, image_size=size, channels=channels), train=False)
    recipe = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size), transforms.PILToTensor()])
    paths = sorted(tmp_path.iterdir())
    train_paths = [p for p in paths if not is_held_out(p.relative_to(tmp_path))]
    assert data.images.shape == (len(train_paths), channels, size, size)
    assert held.images.size(0) == len(paths) - len(train_paths)
    for image, path in zip(data.images, train_paths):
        expected = recipe(Image.open(path).convert("L" if channels == 1 else "RGB"))
        assert (image.int() - expected.int()).abs().max() <= 1
    gray = data.images[[p.name for p in train_paths].index("1.jpg")]  # the gray JPEG: three equal channels in RGB
    assert channels == 1 or torch.equal(gray[0], gray[1]) and torch.equal(gray[1], gray[2])
    # Pillow's convert("L") clips a 16-bit value above 255 to 255: a whole folder of them would read as white
    ramp = np.arange(256 * 256, dtype=np.uint16).reshape(256, 256)
    Image.fromarray(ramp).save(tmp_path / "ramp.png")
    pixels = read_image(str(tmp_path / "ramp.png"), channels, 256)
    assert torch.equal(pixels[0].to(torch.int64), torch.from_numpy(ramp.astype(np.int64) >> 8))
    # an image Pillow cannot read at all: test_a_folder_trains_through_a_worker_and_a_bad_image_read_there_...
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 256 x 256 > 2 x 1000 pixels: Pillow refuses it
    pytest.raises(DataError, read_image, str(tmp_path / "ramp.png"), 3, 16).match("ramp.png is refused")


def test_class_subfolders_are_labels_at_any_depth_the_classifier_cache_no_class_and_a_seventh_is_held_out(tmp_path):
    # data.root/classifiers (the metrics' cache) and an empty folder are no class; a class or an image is a new key
    for i in range(14):
        write_image(tmp_path / "cats" / f"{i}.png", (20, 20), seed=i)
        write_image(tmp_path / "dogs" / "deeper" / f"{i}.jpg", (20, 20), seed=100 + i)
    data, config = cfg_for("folder", tmp_path, image_size=16), ClassifierConfig()
    both = [load_dataset(data, train=t) for t in (True, False)]
    assert all(d.num_classes == 2 for d in both)
    assert torch.cat([d.labels for d in both]).bincount().tolist() == [14, 14]  # cats 0, dogs 1
    key = classifier_key(data, config)
    (tmp_path / CLASSIFIER_CACHE).mkdir()
    (tmp_path / CLASSIFIER_CACHE / f"{key}.pt").write_bytes(b"weights")
    (tmp_path / "empty").mkdir()
    (tmp_path / "only_notes").mkdir()
    (tmp_path / "only_notes" / "readme.txt").write_text("no image here")
    after = load_dataset(data)
    assert after.num_classes == 2 and torch.equal(after.labels, both[0].labels)
    assert torch.equal(after.images, both[0].images) and classifier_key(data, config) == key
    write_image(tmp_path / "birds" / "0.png", (20, 20), seed=99)  # a new class
    second = classifier_key(data, config)
    write_image(tmp_path / "birds" / "1.png", (20, 20), seed=98)  # one more image
    assert len({key, second, classifier_key(data, config)}) == 3
    write_image(tmp_path / "top.png", (20, 20))  # an image beside the folders: one unlabelled set of everything
    write_image(tmp_path / ".hidden" / "skip.png", (20, 20))  # e.g. .ipynb_checkpoints
    both = [open_source(data, train=t) for t in (True, False)]
    assert sum(len(s) for s in both) == 31 and all(s.num_classes == 1 for s in both)
    splits, cfg = [], cfg_for("folder", tmp_path / "flat", image_size=16)  # by a hash of each path: stable
    for first, last in ((0, 140), (140, 180)):  # 140 images, then 40 more
        for i in range(first, last):
            write_image(tmp_path / "flat" / f"{i:03d}.png", (8, 8), seed=i)
        splits.append([set(open_source(cfg, train=t).items) for t in (True, False)])
    (train, held), (train_after, held_after) = splits
    assert not train & held and len(train | held) == 140 and 8 <= len(held) <= 35  # 20 expected
    assert train <= train_after and held <= held_after  # nothing moved between the splits


def test_celeba_is_read_where_torchvision_puts_it_at_64_px(tmp_path):
    (tmp_path / "celeba").write_bytes(b"not a folder")
    with pytest.raises(DataError, match=r"celeba \(absolute path .*\) is a file, not a folder") as caught:
        load_dataset(cfg_for("celeba", tmp_path, channels=3))
    assert "does not exist" not in str(caught.value)
    (tmp_path / "celeba").unlink()
    faces = tmp_path / "celeba" / "img_align_celeba"
    faces.mkdir(parents=True)
    with pytest.raises(DataError, match="holds no image files.*data.download=true"):
        load_dataset(cfg_for("celeba", tmp_path, channels=3, image_size=64))
    for i in range(1, 15):
        write_image(faces / f"{i:06d}.jpg", (178, 218), seed=i)
    (tmp_path / "celeba" / "list_attr_celeba.txt").write_text("not an image\n")
    # the schema's defaults under the option's file, as Hydra lays them (TINY would shrink a composed one)
    recipe = OmegaConf.merge(DataConfig(), OmegaConf.load(CONFIG_DIR / "data" / "celeba.yaml"))
    assert (recipe.image_size, recipe.channels, recipe.batch_size) == (64, 3, 128)  # the tutorial's
    cfg = compose_config("data=celeba", f"data.root={tmp_path}", "data.image_size=64").data
    data = load_dataset(cfg)
    assert data.images.shape[1:] == (3, 64, 64) and data.num_classes == 1
    assert data.images.size(0) + len(open_source(cfg, train=False)) == 14


def test_stacked_sets_are_three_independent_images_with_1000_mode_labels_from_digits_or_mnist(tmp_path):
    cfg = DataConfig(name="stacked", channels=3, num_samples=600, image_size=16)
    source_cfg = DataConfig(num_samples=600, image_size=16)
    data, source = load_dataset(cfg), load_dataset(source_cfg)
    assert data.images.shape == (600, 3, 16, 16) and data.num_classes == 1000
    triples = gan.data.sources.open_generated(cfg, True).items
    assert all(torch.equal(data.images[i, c], source.images[triples[i, c], 0]) for i in range(5) for c in range(3))
    digits = source.labels[triples]
    assert torch.equal(data.labels, digits[:, 0] * 100 + digits[:, 1] * 10 + digits[:, 2])
    assert data.labels.unique().numel() > 400  # 600 draws from 1000 equally likely modes: ~450
    assert torch.equal(load_dataset(cfg).images, data.images)  # a pure function of data.seed
    held_out, other_digits = load_dataset(cfg, train=False), load_dataset(source_cfg, train=False).images
    assert held_out.images.size(0) == 100 and not torch.equal(held_out.images[:5], data.images[:5])
    # the generated digits' own held-out split: 100 images, others than the training split's
    assert other_digits.size(0) == 100 and not any(torch.equal(other_digits[0], image) for image in source.images)
    write_mnist(tmp_path)  # data.source=mnist: read from its files, a missing source named
    data = load_dataset(cfg_for("stacked", tmp_path, source="mnist", channels=3, num_samples=64))
    digits = ((data.images[:, :, :12].flatten(2).float().mean(2) - 100) // 10).long()  # 100 + 10 digit + i % 4
    assert torch.equal(data.labels, digits[:, 0] * 100 + digits[:, 1] * 10 + digits[:, 2])
    with pytest.raises(DataError, match="data.source=fashion_mnist.*FashionMNIST/raw"):
        load_dataset(cfg_for("stacked", tmp_path, source="fashion_mnist", channels=3))


@pytest.mark.parametrize("workers", [0, 1])
def test_a_streamed_folder_gives_the_in_memory_batches_each_image_once_an_epoch_and_resumes_exactly(tmp_path, workers):
    cfg = cfg_for("folder", make_folder(tmp_path), image_size=16)
    streamed, in_memory = (load_dataset(cfg, in_memory=keep).images for keep in (False, True))
    per_epoch, labels = len(in_memory) // 4, torch.arange(len(in_memory))  # the last incomplete batch is dropped
    reference = BatchStream(in_memory, 4, seed=3, device=CPU, num_workers=workers)  # no labels: the same images
    stream = BatchStream(streamed, 4, seed=3, device=CPU, num_workers=workers, labels=labels)
    batches = [stream.next_with_labels() for _ in range(per_epoch + 2)]  # across an epoch boundary
    for x, y in batches:  # each batch with the labels of its own images (here their indices)
        assert torch.equal(x, next(reference)) and torch.equal(x, to_unit_range(in_memory[y]))
    assert reference.next_with_labels()[1] is None
    assert to_unit_range(torch.tensor([0, 255], dtype=torch.uint8)).tolist() == [-1.0, 1.0]  # the range of tanh
    assert torch.cat([y for _, y in batches[:per_epoch]]).unique().numel() == 4 * per_epoch  # each image once
    state = stream.state_dict()
    assert state == {"epoch": 1, "batch": 2}
    following = [stream.next_with_labels() for _ in range(per_epoch)]
    assert stream.state_dict()["epoch"] == 2
    resumed = BatchStream(streamed, 4, seed=3, device=CPU, num_workers=workers, labels=labels)
    resumed.load_state_dict(state)
    for x, y in following:
        rx, ry = resumed.next_with_labels()
        assert torch.equal(rx, x) and torch.equal(ry, y)


def test_a_folder_trains_through_a_worker_and_a_bad_image_read_there_gives_the_workers_own_message(tmp_path):
    folder = make_folder(tmp_path / "images", count=40)
    stream = ("data.in_memory=false", "data.num_workers=1", "data.batch_size=8", "data.image_size=16")
    assert train(compose_config("data=folder", f"data.root={folder}", *stream), tmp_path / "run").step == 6
    (folder / "10.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    dataset = load_dataset(cfg_for("folder", folder, image_size=16, in_memory=False))
    stream = BatchStream(dataset.images, 32, seed=0, device=CPU, num_workers=1)
    with pytest.raises(DataError) as caught:
        for _ in range(3):
            next(stream)
    workers = list(stream.loader._iterator._workers)
    stream.close()  # what collection or the interpreter's exit does: workers ignore SIGTERM, so are stopped
    assert not any(worker.is_alive() for worker in workers)
    message = str(caught.value)
    assert "10.png cannot be read as an image" in message and "Traceback" not in message and "worker" not in message
    assert worker_message("plain") == "plain"  # a message raised in the main process is kept


@pytest.mark.parametrize("kind", ["digits", "mnist", "folder", "stacked"])
def test_streamed_items_equal_in_memory_ones_large_sets_stream_and_limit_keeps_the_first(tmp_path, monkeypatch, kind):
    for i in range(16 if kind == "folder" else 0):  # two classes, so the labels can go wrong
        write_image(tmp_path / f"class_{i % 2}" / f"{i:02d}.png", (20, 20), seed=i)
    write_mnist(tmp_path)  # data=mnist, and data=stacked's source
    cfg = cfg_for(kind, tmp_path, image_size=16, channels=1 if kind == "digits" else 3, source="mnist", num_samples=36)
    assert isinstance(load_dataset(cfg).images, torch.Tensor)  # auto: in memory up to IN_MEMORY_LIMIT bytes, ...
    monkeypatch.setattr(gan.data.sources, "IN_MEMORY_LIMIT", 16 * 16 - 1)  # ... streamed above (here: any set)
    full, streamed = load_dataset(cfg, in_memory=True), load_dataset(cfg).images  # in_memory=True: the caller's
    assert isinstance(full.images, torch.Tensor) and isinstance(streamed, ImageSource)
    limited = dataclasses.replace(cfg, limit=10)
    assert torch.equal(torch.stack([streamed[i] for i in range(len(streamed))]), full.images)
    for in_memory in (True, False):
        part = load_dataset(limited, in_memory=in_memory)
        assert len(part.images) == part.labels.numel() == 10 and part.num_classes == full.num_classes
        assert torch.equal(take(part.images, torch.arange(10)), full.images[:10])  # a tensor or a streamed source
        assert torch.equal(part.labels, full.labels[:10])
    assert torch.equal(load_dataset(limited, train=False).labels, load_dataset(cfg, train=False).labels)  # whole
    assert kind != "folder" or 0 < full.labels[:10].sum() < 10  # the first ten span both classes


def test_a_limit_above_the_training_split_is_refused_naming_its_size(tmp_path):
    write_mnist(tmp_path, train=40)
    over = r"data\.limit=41 is more than the 40 images in the training split of data=mnist"
    pytest.raises(ConfigError, load_dataset, cfg_for("mnist", tmp_path, limit=41, batch_size=32)).match(over)
    assert len(load_dataset(cfg_for("mnist", tmp_path, limit=40, batch_size=32)).labels) == 40
    generated = r"data=digits\. Set data\.limit to at most \d+ \(or raise data\.num_samples\)"  # what decides its size
    pytest.raises(ConfigError, load_dataset, DataConfig(num_samples=64, limit=100)).match(generated)


@pytest.mark.parametrize("size", [16, 32, 64, 128])
def test_a_training_step_at_each_image_size(tmp_path, size):
    write_mnist(tmp_path / "data", train=64)
    root, steps = f"data.root={tmp_path / 'data'}", ("trainer.max_steps=2", "model.g_width=4", "model.d_width=4")
    cfg = compose_config("data=mnist", root, f"data.image_size={size}", "data.channels=3", *steps)
    result = train(cfg, tmp_path / "run")
    assert result.step == 2 and all(np.isfinite(v) for v in result.metrics.values())
    assert (tmp_path / "run" / "samples" / "step_000002.png").is_file()


# data no loader can serve: one paragraph naming the setting or file, before anything is written (exit 2: test_config)
BEFORE_TRAINING = {  # data.root -> what the paragraph says ({tmp}: the test's folder)
    "a folder root that is a file": ("{tmp}/one.png", "data.root='{tmp}/one.png' is a file"),
    "a folder smaller than one batch": ("{tmp}/three", "fewer than data.batch_size=32"),  # debug=tiny's batch
}


@pytest.mark.parametrize("root, said", BEFORE_TRAINING.values(), ids=BEFORE_TRAINING)
def test_data_no_loader_can_serve_is_refused_before_training_in_one_paragraph(tmp_path, root, said):
    write_image(tmp_path / "one.png", (20, 20))
    make_folder(tmp_path / "three", count=3)
    with pytest.raises(DataError) as caught:
        train(compose_config("data=folder", f"data.root={root.format(tmp=tmp_path)}"), tmp_path / "run")
    message = str(caught.value)
    assert said.format(tmp=tmp_path) in message and "does not exist" not in message and "\n" not in message
    assert not (tmp_path / "run").exists() or not any(path.is_file() for path in (tmp_path / "run").rglob("*"))


# a packed dataset: decoded and resized once (gan/data/pack.py), then trained from with no decoding
def pack_folder(tmp_path: Path, count: int = 24) -> Path:
    """A pack of `count` gray 16 px images in tmp_path/pack; returns pack.pt."""
    write_pack(cfg_for("folder", make_folder(tmp_path / "images", count), image_size=16), tmp_path / "pack")
    return tmp_path / "pack" / "pack.pt"


@pytest.mark.parametrize("channels", [1, 3])
def test_a_pack_holds_the_folder_s_pixels_labels_and_splits_packed_from_train_py_s_data_overrides(tmp_path, channels):
    for i in range(30):  # two classes, of mixed sizes
        write_image(tmp_path / "images" / ("ab"[i % 2]) / f"{i:02d}.png", (24 + i, 20), seed=i)
    folder = cfg_for("folder", tmp_path / "images", image_size=16, channels=channels)
    args = ["data=folder", f"data.root={tmp_path / 'images'}", "data.image_size=16", f"data.channels={channels}"]
    assert pack_main([str(tmp_path / "pack"), *args]) == 0
    packed = cfg_for("packed", tmp_path / "pack", image_size=16, channels=channels)
    for training in (True, False):
        expected, got = (load_dataset(cfg, training, in_memory=True) for cfg in (folder, packed))
        assert torch.equal(got.images, expected.images) and torch.equal(got.labels, expected.labels)
        assert got.num_classes == expected.num_classes == 2
    settings = torch.load(tmp_path / "pack" / "pack.pt", weights_only=True)["settings"]
    assert settings["name"] == "folder" and settings["root"] == str((tmp_path / "images").resolve())


def damage_pack(file: Path, **entries) -> None:
    torch.save({**torch.load(file, weights_only=True), **entries}, file)


NO_PACK = {  # what pack.pt is made to hold -> what the refusal says it holds
    "empty": (lambda file: file.write_bytes(b""), "it is empty, 0 bytes"),
    "a tensor": (lambda file: torch.save(torch.zeros(3), file), "it holds Tensor"),
    "other keys": (lambda file: torch.save({"images": 1}, file), "it holds ['images']"),
    "cut short": (lambda file: file.write_bytes(file.read_bytes()[:1000]), ""),
    "settings": (lambda file: damage_pack(file, settings={"image_size": "16"}), "its settings or content hash are "),
    "no hash": (lambda file: damage_pack(file, content=None), "its settings or content hash are damaged"),
    "missing": (lambda file: file.unlink(), None),
    "of another size": (lambda file: None, None),
}


@pytest.mark.parametrize("damage, says", NO_PACK.values(), ids=NO_PACK)
def test_a_pack_file_that_is_no_pack_is_named_with_what_it_holds(tmp_path, damage, says):
    file = pack_folder(tmp_path)
    damage(file)
    error, message = DataError, re.escape(f"{file} cannot be read as a pack ({says}")
    if says is None and file.is_file():
        error, message = ConfigError, r"packed at 16 px with 1 channel\(s\).*Set data.image_size=16 data.channels=1"
    elif says is None:
        message = f"no pack in {re.escape(str(file.parent))} .*python -m gan.data.pack"
    with pytest.raises(error, match=message):
        load_dataset(cfg_for("packed", file.parent, image_size=32 if error is ConfigError else 16))


def test_the_pack_command_refuses_what_it_cannot_pack_and_prints_its_usage(tmp_path, monkeypatch, capsys):
    make_folder(tmp_path / "images")
    assert pack_main([str(tmp_path / "again"), "data=packed", f"data.root={tmp_path / 'pack'}"]) == 2  # a pack
    assert pack_main(["data=folder"]) == 2  # no output folder
    assert pack_main([str(tmp_path / "bad"), "data=folder", "data.image_size=17"]) == 2
    assert not (tmp_path / "again").exists() and not (tmp_path / "bad").exists()
    monkeypatch.chdir(tmp_path / "images")
    capsys.readouterr()
    assert pack_main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: ") and len(list(Path().iterdir())) == 24  # nothing written


PACK_FAULTS = {  # what stops the pack command -> exit code, what it says
    "not data.*": (None, ["debug=tiny", "trainer.max_steps=3"], 2, "debug=tiny trainer.max_steps=3: a pack holds"),
    "full disk": (OSError(28, "No space left on device"), [], 2, "No space left on device (errno 28). Free disk"),
    "read-only": (OSError(30, "Read-only file system"), [], 2, "mounted read-only"),
    "Ctrl-C": (KeyboardInterrupt(), [], 130, "Interrupted: no pack was written"),
}


@pytest.mark.parametrize("fault, extra, code, says", PACK_FAULTS.values(), ids=PACK_FAULTS.keys())
def test_a_refused_or_interrupted_pack_says_why_and_leaves_no_partial_file(
    tmp_path, monkeypatch, caplog, fault, extra, code, says
):
    def save(obj: object, f) -> None:  # torch.save that writes a little of its file, then meets the fault
        f.write(b"PK partial")
        raise fault

    (tmp_path / "pack").mkdir()
    if fault is not None:
        monkeypatch.setattr(gan.checkpoint.torch, "save", save)
    args = ["data=folder", f"data.root={make_folder(tmp_path / 'images', 8)}", "data.image_size=16", *extra]
    assert pack_main([str(tmp_path / "pack"), *args]) == code
    assert says in caplog.text and list((tmp_path / "pack").iterdir()) == []


def test_a_resume_refuses_a_pack_other_than_the_one_its_run_trained_from(tmp_path, monkeypatch, one_thread):
    settings = ["data=packed", f"data.root={tmp_path / 'pack'}", "data.batch_size=8"]
    pack_folder(tmp_path)
    with monkeypatch.context() as guard:  # training from a pack, in memory or streamed, decodes no image file
        guard.setattr(gan.data.sources, "read_image", lambda *args: pytest.fail("an image file was decoded"))
        streamed = load_dataset(cfg_for("packed", tmp_path / "pack", image_size=16), in_memory=False).images
        assert next(BatchStream(streamed, 4, seed=0, device=CPU, num_workers=0)).shape == (4, 1, 16, 16)
        assert train(compose_config(*settings, "trainer.max_steps=3"), tmp_path / "run").step == 3
    resumed = compose_config(*settings, "trainer.max_steps=4", f"trainer.resume={tmp_path / 'run'}")
    pack_folder(tmp_path)  # the same images, packed again
    assert train(resumed, tmp_path / "run").step == 4
    write_image(tmp_path / "images" / "00.png", (24, 20), seed=99)  # one image changed, packed again
    write_pack(cfg_for("folder", tmp_path / "images", image_size=16), tmp_path / "pack")
    again = compose_config(*settings, "trainer.max_steps=6", f"trainer.resume={tmp_path / 'run'}")
    with pytest.raises(DataError, match=r"data.root holds another pack \(hash \w+\) than the run.s"):
        train(again, tmp_path / "run")
