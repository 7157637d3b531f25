"""Real datasets, read from small files each test writes in the real on-disk format.

MNIST and Fashion-MNIST as the four uncompressed IDX files torchvision reads from ROOT/<Class>/raw,
CIFAR-10 as the pickled batches of ROOT/cifar-10-batches-py, folders of PNG and JPEG files, CelebA
as ROOT/celeba/img_align_celeba. No test downloads anything (internet sockets are blocked below) or
reads outside its temporary directory.
"""

from __future__ import annotations

import pickle
import socket
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.datasets.cifar
from conftest import CONFIG_DIR, compose_config, run_train
from omegaconf import OmegaConf
from PIL import Image
from torchvision import transforms

import gan.data.sources
from gan.config import ConfigError, DataConfig
from gan.data import BatchStream, DataError, ImageSource, is_held_out, load_dataset, open_source, read_image
from gan.data.pack import main as pack_main
from gan.data.pack import write_pack
from gan.data.sources import CLASSIFIER_CACHE
from gan.training import train

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _no_internet(monkeypatch):
    """Any attempt to open an internet connection fails the test (local sockets still work)."""
    connect = socket.socket.connect

    def guarded(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"a test tried to connect to {address}")
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


# writers of the real formats ---------------------------------------------------------------------


def write_idx(path: Path, array: np.ndarray) -> None:
    """IDX (LeCun's MNIST format): 0, 0, type 0x08 (uint8), ndim; big-endian int32 sizes; the bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def mnist_image(value: int) -> np.ndarray:
    """28x28: the top half at `value`, the bottom half black, so a transposed read would show."""
    image = np.zeros((28, 28), np.uint8)
    image[:14] = value
    return image


def write_mnist(root: Path, folder: str = "MNIST", train: int = 40, test: int = 8) -> list[int]:
    """`train` + `test` images whose top half holds 100 + label * 10 + (index % 4); returns the
    training labels (index % 10)."""
    raw = root / folder / "raw"
    for prefix, count in (("train", train), ("t10k", test)):
        labels = np.arange(count) % 10
        if prefix == "t10k":
            labels = (labels + 5) % 10  # the test split starts at another class: it is not the train split
        write_idx(
            raw / f"{prefix}-images-idx3-ubyte",
            np.stack([mnist_image(100 + int(c) * 10 + i % 4) for i, c in enumerate(labels)]),
        )
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return [i % 10 for i in range(train)]


def cifar_batch(count: int, offset: int) -> dict:
    """The layout of CIFAR-10's python pickles: 'data' is (N, 3072) uint8 rows, the 1024 red values,
    then green, then blue, each plane row-major; 'labels' a list of ints."""
    images = np.zeros((count, 3, 32, 32), np.uint8)
    for i in range(count):
        images[i, 0], images[i, 1], images[i, 2] = 200, 100, offset + i  # red, green, blue
        images[i, :, 16:, :] = 0  # bottom half black: a transposed read would show
    return {
        "batch_label": "test",
        "labels": [(offset + i) % 10 for i in range(count)],
        "data": images.reshape(count, 3072),
        "filenames": [f"{offset + i}.png" for i in range(count)],
    }


def write_cifar(root: Path, per_batch: int = 2) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for b, name in enumerate(names):
        with open(folder / name, "wb") as f:
            pickle.dump(cifar_batch(per_batch, offset=b * per_batch), f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump(
            {
                "label_names": [
                    "airplane",
                    "automobile",
                    "bird",
                    "cat",
                    "deer",
                    "dog",
                    "frog",
                    "horse",
                    "ship",
                    "truck",
                ],
                "num_vis": 3072,
            },
            f,
        )
    return folder


def write_image(path: Path, size: tuple[int, int], mode: str = "RGB", seed: int = 0) -> np.ndarray:
    """A random image of (width, height) saved by Pillow in the format its suffix names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = (size[1], size[0]) + ((3,) if mode == "RGB" else ())
    pixels = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    Image.fromarray(pixels, mode).save(path)
    return pixels


def cfg_for(name: str, root: Path, **overrides) -> DataConfig:
    return DataConfig(name=name, root=str(root), **overrides)


def patch_cifar_checksums(monkeypatch) -> None:
    """torchvision checks each CIFAR-10 file's md5 against the official archive (`_check_integrity`,
    `_load_meta`); files a test writes cannot match. Only that comparison is replaced, by a check
    that the file exists: torchvision's layout, unpickling and HWC arrays stay the ones under test.
    test_cifar10_with_wrong_checksums_is_refused shows what the real check does to these files."""
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda path, md5=None: Path(path).is_file())


# torchvision's datasets ----------------------------------------------------------------------------


@pytest.mark.parametrize("name, folder", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_mnist_like_datasets_read_torchvision_layout_resized_and_oriented(tmp_path, name, folder):
    labels = write_mnist(tmp_path, folder)
    data = load_dataset(cfg_for(name, tmp_path, image_size=32))
    assert data.images.shape == (40, 1, 32, 32) and data.images.dtype == torch.uint8
    assert data.labels.tolist() == labels and data.num_classes == 10
    top, bottom = data.images[:, 0, :12], data.images[:, 0, -12:]
    values = [100 + c * 10 + i % 4 for i, c in enumerate(labels)]
    assert top.flatten(1).float().mean(1).tolist() == values  # in file order, rows as rows
    assert int(bottom.max()) == 0

    held_out = load_dataset(cfg_for(name, tmp_path), train=False)
    assert held_out.images.size(0) == 8 and held_out.labels[0] == 5  # the t10k files


def test_grayscale_becomes_rgb_by_repeating_its_channel(tmp_path):
    write_mnist(tmp_path)
    gray = load_dataset(cfg_for("mnist", tmp_path, channels=1)).images
    rgb = load_dataset(cfg_for("mnist", tmp_path, channels=3)).images
    assert rgb.shape == (40, 3, 32, 32)
    assert all(torch.equal(rgb[:, c : c + 1], gray) for c in range(3))


def test_cifar10_reads_the_pickled_batches_as_rgb_planes(tmp_path, monkeypatch):
    write_cifar(tmp_path)
    patch_cifar_checksums(monkeypatch)
    data = load_dataset(cfg_for("cifar10", tmp_path, image_size=32, channels=3))
    assert data.images.shape == (10, 3, 32, 32) and data.num_classes == 10  # 5 batches of 2
    assert data.labels.tolist() == list(range(10))
    top = data.images[:, :, :16].flatten(2).float().mean(2)  # (N, 3) mean of each plane's top half
    assert top[:, 0].eq(200).all() and top[:, 1].eq(100).all() and top[:, 2].tolist() == list(range(10))
    assert int(data.images[:, :, 16:].max()) == 0
    held_out = load_dataset(cfg_for("cifar10", tmp_path, channels=3), train=False)
    assert held_out.labels.tolist() == [0, 1]  # test_batch: offsets 10, 11


def test_rgb_becomes_gray_as_pillow_converts_it(tmp_path, monkeypatch):
    write_cifar(tmp_path)
    patch_cifar_checksums(monkeypatch)
    gray = load_dataset(cfg_for("cifar10", tmp_path, channels=1)).images
    expected = Image.fromarray(np.array([[[200, 100, 7]]], np.uint8)).convert("L").getpixel((0, 0))
    assert gray.shape == (10, 1, 32, 32) and int(gray[7, 0, 0, 0]) == expected


def test_cifar10_with_wrong_checksums_is_refused(tmp_path):
    folder = write_cifar(tmp_path)  # the real layout with the wrong bytes: torchvision's md5 check fails
    with pytest.raises(DataError, match="checksum") as err:
        load_dataset(cfg_for("cifar10", tmp_path, channels=3))
    assert str(folder.resolve()) in str(err.value) and "data.download=true" in str(err.value)


def test_download_is_not_attempted_when_the_files_are_there(tmp_path, monkeypatch):
    write_mnist(tmp_path)
    monkeypatch.setattr(
        torchvision.datasets.mnist, "download_and_extract_archive", lambda *a, **k: pytest.fail("tried to download")
    )
    assert load_dataset(cfg_for("mnist", tmp_path, download=True)).images.size(0) == 40


def test_a_failed_download_is_a_data_error(tmp_path, monkeypatch):
    def offline(self):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    monkeypatch.setattr(torchvision.datasets.MNIST, "download", offline)
    with pytest.raises(DataError, match="could not be downloaded.*Error downloading"):
        load_dataset(cfg_for("mnist", tmp_path, download=True))


# missing and empty roots ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected, remedy",
    [
        ("mnist", "MNIST/raw", "data.download=true"),
        ("fashion_mnist", "FashionMNIST/raw", "data.download=true"),
        ("cifar10", "cifar-10-batches-py", "data.download=true"),
        ("celeba", "celeba", "data.download=true"),
        ("folder", "nowhere", "nothing to download"),
    ],
)
def test_a_missing_root_says_where_what_and_how_to_get_it(tmp_path, name, expected, remedy):
    root = tmp_path / "nowhere"
    with pytest.raises(DataError) as err:
        load_dataset(cfg_for(name, root, channels=3))
    message = str(err.value)
    assert str((root / expected).resolve() if name != "folder" else root.resolve()) in message
    assert remedy in message and f"data={name}" in message


def test_a_partial_mnist_names_the_missing_file(tmp_path):
    write_mnist(tmp_path)
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="missing: t10k-labels-idx1-ubyte"):
        load_dataset(cfg_for("mnist", tmp_path))


@pytest.mark.parametrize("content", [[], ["notes.txt", "sub/readme.md"]])
def test_a_folder_without_images_is_refused(tmp_path, content):
    for name in content:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("not an image")
    with pytest.raises(DataError, match="holds no image files"):
        load_dataset(cfg_for("folder", tmp_path))


def test_an_unreadable_image_is_named(tmp_path):
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(DataError, match="broken.png cannot be read"):
        read_image(str(bad), 3, 16)


def test_too_few_images_for_one_batch_is_refused(tmp_path):
    write_mnist(tmp_path)
    images = load_dataset(cfg_for("mnist", tmp_path)).images
    with pytest.raises(DataError, match="fewer than data.batch_size=64"):
        BatchStream(images, batch_size=64, seed=0, device=CPU)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(name="nosuch"), "data.name"),
        (dict(name="stacked", source="cifar10", channels=3), "data.source"),
        (dict(name="stacked", channels=1), "data.channels"),
        (dict(name="folder", download=True), "data.download"),
        (dict(name="digits", download=True), "data.download"),
    ],
)
def test_config_refuses_what_no_loader_can_do(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        DataConfig(**overrides).check()


# folders ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("size, channels", [(16, 3), (64, 3), (32, 1)])
def test_folder_images_follow_the_dcgan_tutorial_recipe(tmp_path, size, channels):
    """Resize(size) + CenterCrop(size) on the decoded image, as the PyTorch DCGAN tutorial does with
    PIL; ours runs on uint8 tensors (antialiased bilinear), equal up to a rounding step."""
    for i, (width, height) in enumerate([(48, 32), (30, 50), (178, 218), (20, 12)]):
        write_image(tmp_path / f"{i}.png", (width, height), seed=i)
    data = load_dataset(cfg_for("folder", tmp_path, image_size=size, channels=channels), train=True)
    held = load_dataset(cfg_for("folder", tmp_path, image_size=size, channels=channels), train=False)
    recipe = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size), transforms.PILToTensor()])
    paths = sorted(tmp_path.glob("*.png"))
    train_paths = [p for p in paths if not is_held_out(p.relative_to(tmp_path))]
    assert data.images.shape == (len(train_paths), channels, size, size)
    assert held.images.size(0) == len(paths) - len(train_paths)
    for image, path in zip(data.images, train_paths):
        expected = recipe(Image.open(path).convert("L" if channels == 1 else "RGB"))
        assert (image.int() - expected.int()).abs().max() <= 1


def test_jpeg_png_gray_and_rgb_files_mix_in_one_folder(tmp_path):
    write_image(tmp_path / "a.jpg", (40, 40), "L")
    write_image(tmp_path / "b.png", (40, 40), "RGB")
    write_image(tmp_path / "c.bmp", (40, 40), "RGB")
    source = open_source(cfg_for("folder", tmp_path, image_size=16, channels=3))
    # Split aside, look at every file: the gray JPEG comes out with three equal channels.
    gray = read_image(str(tmp_path / "a.jpg"), 3, 16)
    assert gray.shape == (3, 16, 16) and torch.equal(gray[0], gray[1]) and torch.equal(gray[1], gray[2])
    assert read_image(str(tmp_path / "b.png"), 1, 16).shape == (1, 16, 16)
    assert all(source[i].shape == (3, 16, 16) for i in range(len(source)))


def test_class_subfolders_become_labels_and_are_searched_at_any_depth(tmp_path):
    for i in range(14):
        write_image(tmp_path / "cats" / f"{i}.png", (20, 20), seed=i)
        write_image(tmp_path / "dogs" / "deeper" / f"{i}.jpg", (20, 20), seed=100 + i)
    both = [load_dataset(cfg_for("folder", tmp_path, image_size=16), train=t) for t in (True, False)]
    assert sum(d.labels.numel() for d in both) == 28
    assert all(d.num_classes == 2 for d in both)
    assert torch.cat([d.labels for d in both]).bincount().tolist() == [14, 14]  # cats 0, dogs 1


def test_the_classifier_cache_and_empty_folders_are_not_classes(tmp_path):
    """The metrics cache their classifier in data.root/classifiers, the image folder itself under
    data=folder: once written, it must not turn 2 classes into 3 (nor may an empty folder)."""
    for i in range(14):
        write_image(tmp_path / "cats" / f"{i}.png", (20, 20), seed=i)
        write_image(tmp_path / "dogs" / f"{i}.png", (20, 20), seed=100 + i)
    before = load_dataset(cfg_for("folder", tmp_path, image_size=16))
    (tmp_path / CLASSIFIER_CACHE).mkdir()
    (tmp_path / CLASSIFIER_CACHE / "folder-16px-3ch-0123456789.pt").write_bytes(b"weights")
    (tmp_path / "empty").mkdir()
    (tmp_path / "only_notes").mkdir()
    (tmp_path / "only_notes" / "readme.txt").write_text("no image here")
    after = load_dataset(cfg_for("folder", tmp_path, image_size=16))
    assert before.num_classes == after.num_classes == 2
    assert torch.equal(before.labels, after.labels) and torch.equal(before.images, after.images)


def test_a_folder_s_cached_classifier_is_keyed_by_its_images_and_classes(tmp_path):
    """A classifier cached for a folder must not judge it once a class or an image is added."""
    from gan.config import ClassifierConfig
    from gan.evaluation.metrics import classifier_key

    for i in range(7):
        write_image(tmp_path / "cats" / f"{i}.png", (20, 20), seed=i)
    data, config = cfg_for("folder", tmp_path, image_size=16), ClassifierConfig()
    first = classifier_key(data, config)
    (tmp_path / CLASSIFIER_CACHE).mkdir()
    (tmp_path / CLASSIFIER_CACHE / f"{first}.pt").write_bytes(b"weights")  # the cache is no image
    assert classifier_key(data, config) == first
    write_image(tmp_path / "dogs" / "0.png", (20, 20), seed=99)  # a new class
    second = classifier_key(data, config)
    write_image(tmp_path / "dogs" / "1.png", (20, 20), seed=98)  # one more image
    assert len({first, second, classifier_key(data, config)}) == 3


def test_images_beside_folders_make_one_unlabelled_set_of_everything(tmp_path):
    write_image(tmp_path / "top.png", (20, 20))
    for i in range(20):
        write_image(tmp_path / "a" / "b" / f"{i}.png", (20, 20), seed=i)
    write_image(tmp_path / ".hidden" / "skip.png", (20, 20))  # e.g. .ipynb_checkpoints
    both = [open_source(cfg_for("folder", tmp_path, image_size=16), train=t) for t in (True, False)]
    assert sum(len(s) for s in both) == 21 and all(s.num_classes == 1 for s in both)


def test_folder_split_is_about_a_seventh_and_stable_when_images_are_added(tmp_path):
    for i in range(140):
        write_image(tmp_path / f"{i:03d}.png", (8, 8), seed=i)

    def split() -> tuple[set[str], set[str]]:
        train, held = (open_source(cfg_for("folder", tmp_path, image_size=16), train=t) for t in (True, False))
        return set(train.paths), set(held.paths)

    train, held = split()
    assert not train & held and len(train | held) == 140
    assert 8 <= len(held) <= 35  # 20 expected
    for i in range(140, 180):
        write_image(tmp_path / f"{i:03d}.png", (8, 8), seed=i)
    train_after, held_after = split()
    assert train <= train_after and held <= held_after  # nothing moved between the splits


def test_celeba_is_read_where_torchvision_puts_it_at_64_px(tmp_path):
    faces = tmp_path / "celeba" / "img_align_celeba"
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


def test_empty_celeba_folder_is_refused_with_the_download_override(tmp_path):
    (tmp_path / "celeba" / "img_align_celeba").mkdir(parents=True)
    with pytest.raises(DataError, match="holds no image files.*data.download=true"):
        load_dataset(cfg_for("celeba", tmp_path, channels=3, image_size=64))


# stacked ---------------------------------------------------------------------------------------


def test_stacked_digits_are_three_independent_images_with_1000_mode_labels():
    cfg = DataConfig(name="stacked", channels=3, num_samples=600, image_size=16)
    data, source = load_dataset(cfg), load_dataset(DataConfig(num_samples=600, image_size=16))
    assert data.images.shape == (600, 3, 16, 16) and data.num_classes == 1000
    triples = gan.data.sources.open_stacked(cfg, True).triples
    for i in range(5):
        for channel in range(3):
            assert torch.equal(data.images[i, channel], source.images[triples[i, channel], 0])
    digits = source.labels[triples]
    assert torch.equal(data.labels, digits[:, 0] * 100 + digits[:, 1] * 10 + digits[:, 2])
    assert data.labels.unique().numel() > 400  # 600 draws from 1000 equally likely modes: ~450
    assert torch.equal(load_dataset(cfg).images, data.images)  # a pure function of data.seed
    held_out = load_dataset(cfg, train=False)
    assert held_out.images.size(0) == 100 and not torch.equal(held_out.images[:5], data.images[:5])


def test_stacked_mnist_reads_its_source_from_the_mnist_files(tmp_path):
    write_mnist(tmp_path)
    data = load_dataset(cfg_for("stacked", tmp_path, source="mnist", channels=3, num_samples=64))
    top = data.images[:, :, :12].flatten(2).float().mean(2)  # (N, 3): 100 + 10 * digit + (i % 4)
    digits = ((top - 100) // 10).long()
    assert torch.equal(data.labels, digits[:, 0] * 100 + digits[:, 1] * 10 + digits[:, 2])


def test_stacked_names_its_missing_source(tmp_path):
    with pytest.raises(DataError, match="data.source=fashion_mnist.*FashionMNIST/raw"):
        load_dataset(cfg_for("stacked", tmp_path, source="fashion_mnist", channels=3))


# in memory or streamed -------------------------------------------------------------------------


def make_folder(root: Path, count: int = 24) -> Path:
    for i in range(count):
        write_image(root / f"{i:02d}.png", (24 + i, 20), seed=i)
    return root


@pytest.mark.parametrize("kind", ["mnist", "folder", "stacked"])
def test_streamed_items_equal_the_in_memory_tensor(tmp_path, kind):
    if kind == "folder":
        make_folder(tmp_path)
    else:
        write_mnist(tmp_path)
    cfg = cfg_for(kind, tmp_path, image_size=16, channels=3, source="mnist", num_samples=32)
    streamed = load_dataset(cfg, in_memory=False).images
    assert isinstance(streamed, ImageSource)
    in_memory = load_dataset(cfg, in_memory=True).images
    assert torch.equal(torch.stack([streamed[i] for i in range(len(streamed))]), in_memory)


def test_auto_holds_small_sets_in_memory_and_streams_large_ones(tmp_path, monkeypatch):
    write_mnist(tmp_path)
    cfg = cfg_for("mnist", tmp_path, image_size=16)  # 40 images x 256 bytes
    assert isinstance(load_dataset(cfg).images, torch.Tensor)
    monkeypatch.setattr(gan.data.sources, "IN_MEMORY_LIMIT", 40 * 256 - 1)
    assert isinstance(load_dataset(cfg).images, ImageSource)
    assert isinstance(load_dataset(cfg, in_memory=True).images, torch.Tensor)  # the caller decides


@pytest.mark.parametrize("workers", [0, 1])
def test_a_streamed_folder_gives_the_in_memory_batches_and_resumes_exactly(tmp_path, workers):
    cfg = cfg_for("folder", make_folder(tmp_path), image_size=16)
    streamed = load_dataset(cfg, in_memory=False).images
    in_memory = load_dataset(cfg, in_memory=True).images
    batch = 4
    reference = BatchStream(in_memory, batch, seed=3, device=CPU, num_workers=0)
    stream = BatchStream(streamed, batch, seed=3, device=CPU, num_workers=workers)
    for _ in range(len(in_memory) // batch + 2):  # across an epoch boundary
        images = next(stream)
        assert torch.equal(images, next(reference)) and images.min() >= -1 and images.max() <= 1
    state = stream.state_dict()
    following = [next(stream) for _ in range(3)]
    resumed = BatchStream(streamed, batch, seed=3, device=CPU, num_workers=workers)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, next(resumed)) for a in following)


def test_pixels_reach_the_loop_scaled_to_the_range_of_tanh(tmp_path):
    checkers = Image.fromarray(np.array([[0, 255], [255, 0]], np.uint8), "L").resize((20, 20))
    for name in "abcd":  # 1 in 7 is held out: some of the four are training images
        checkers.save(tmp_path / f"{name}.png")
    images = load_dataset(cfg_for("folder", tmp_path, image_size=16, channels=1), in_memory=True).images
    batch = next(BatchStream(images.repeat(4, 1, 1, 1), 4, seed=0, device=CPU))
    assert batch.dtype == torch.float32 and batch.min() == -1 and batch.max() == 1


# training on each size -------------------------------------------------------------------------


@pytest.mark.parametrize("size", [16, 32, 64, 128])
def test_a_training_step_at_each_image_size(tmp_path, size):
    write_mnist(tmp_path / "data", train=64)
    cfg = compose_config(
        "data=mnist",
        f"data.root={tmp_path / 'data'}",
        f"data.image_size={size}",
        "data.channels=3",
        "trainer.max_steps=2",
        "model.g_width=4",
        "model.d_width=4",
    )
    result = train(cfg, tmp_path / "run")
    assert result.step == 2 and all(np.isfinite(v) for v in result.metrics.values())
    assert (tmp_path / "run" / "samples" / "step_000002.png").is_file()


def test_training_streams_a_folder_through_a_worker(tmp_path):
    make_folder(tmp_path / "images", count=40)
    cfg = compose_config(
        "data=folder",
        f"data.root={tmp_path / 'images'}",
        "data.image_size=16",
        "data.in_memory=false",
        "data.num_workers=1",
        "data.batch_size=8",
        "trainer.max_steps=3",
    )
    assert train(cfg, tmp_path / "run").step == 3


def test_a_missing_dataset_fails_before_training_with_one_clear_message(tmp_path):
    result = run_train("data=fashion_mnist", f"data.root={tmp_path / 'nowhere'}", f"hydra.run.dir={tmp_path / 'run'}")
    output = result.stdout + result.stderr
    assert result.returncode == 2
    assert "FashionMNIST/raw" in output and "data.download=true" in output
    assert "Traceback" not in output
    assert not (tmp_path / "run" / "checkpoints").exists()


# a packed dataset: decoded and resized once (gan/data/pack.py), then trained from with no decoding ----------


@pytest.mark.parametrize("channels", [1, 3])
def test_a_pack_holds_the_folder_s_pixels_labels_and_splits(tmp_path, channels):
    for i in range(30):  # two classes, of mixed sizes
        write_image(tmp_path / "images" / ("ab"[i % 2]) / f"{i:02d}.png", (24 + i, 20), seed=i)
    folder = cfg_for("folder", tmp_path / "images", image_size=16, channels=channels)
    write_pack(folder, tmp_path / "pack")
    packed = cfg_for("packed", tmp_path / "pack", image_size=16, channels=channels)
    for training in (True, False):
        expected, got = (load_dataset(cfg, training, in_memory=True) for cfg in (folder, packed))
        assert torch.equal(got.images, expected.images) and torch.equal(got.labels, expected.labels)
        assert got.num_classes == expected.num_classes == 2
    settings = torch.load(tmp_path / "pack" / "pack.pt", weights_only=True)["settings"]
    assert settings["name"] == "folder" and settings["root"] == str((tmp_path / "images").resolve())


def test_training_from_a_pack_decodes_nothing(tmp_path, monkeypatch, one_thread):
    write_pack(cfg_for("folder", make_folder(tmp_path / "images"), image_size=16), tmp_path / "pack")

    def no_decoding(*args: object) -> None:
        raise AssertionError("an image file was decoded")

    monkeypatch.setattr(gan.data.sources, "read_image", no_decoding)
    streamed = load_dataset(cfg_for("packed", tmp_path / "pack", image_size=16), in_memory=False).images
    batch = next(BatchStream(streamed, 4, seed=0, device=CPU, num_workers=0))
    assert batch.shape == (4, 1, 16, 16)
    packed = compose_config("data=packed", f"data.root={tmp_path / 'pack'}", "data.batch_size=8")
    assert train(packed, tmp_path / "run").step == 6


def test_a_pack_of_another_size_a_missing_or_a_damaged_pack_is_refused(tmp_path):
    write_pack(cfg_for("folder", make_folder(tmp_path / "images"), image_size=16), tmp_path / "pack")
    with pytest.raises(
        ConfigError, match=r"packed at 16 px with 1 channel\(s\).*Set data.image_size=16 data.channels=1"
    ):
        load_dataset(cfg_for("packed", tmp_path / "pack", image_size=32, channels=1))
    with pytest.raises(DataError, match="no pack in .*python -m gan.data.pack"):
        load_dataset(cfg_for("packed", tmp_path / "nowhere", image_size=16))
    file = tmp_path / "pack" / "pack.pt"
    file.write_bytes(file.read_bytes()[:1000])
    with pytest.raises(DataError, match="cannot be read as a pack"):
        load_dataset(cfg_for("packed", tmp_path / "pack", image_size=16))


def test_the_pack_command_takes_train_py_s_data_overrides(tmp_path):
    make_folder(tmp_path / "images")
    args = ["data=folder", f"data.root={tmp_path / 'images'}", "data.image_size=16", "data.channels=3"]
    assert pack_main([str(tmp_path / "pack"), *args]) == 0
    assert torch.load(tmp_path / "pack" / "pack.pt", weights_only=True)["train"]["images"].shape[1:] == (3, 16, 16)
    assert pack_main([str(tmp_path / "again"), "data=packed", f"data.root={tmp_path / 'pack'}"]) == 2
    assert pack_main(["data=folder"]) == 2  # no output folder
    assert pack_main([str(tmp_path / "bad"), "data=folder", "data.image_size=17"]) == 2
    assert not (tmp_path / "again").exists() and not (tmp_path / "bad").exists()
