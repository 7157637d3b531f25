"""Damaged datasets: every case is a DataError (or a ConfigError) whose one paragraph names the file
and what is wrong, never a bare AssertionError, a worker's pasted traceback or a silent acceptance."""

from __future__ import annotations

import gzip
import re

import numpy as np
import pytest
import torch
from PIL import Image
from test_datasets import cfg_for, write_idx, write_image, write_mnist

from gan.config import ConfigError
from gan.data import BatchStream, DataError, load_dataset, read_image
from gan.data.stream import worker_message

CPU = torch.device("cpu")


def test_an_idx_file_with_a_wrong_magic_number_is_named(tmp_path):
    write_mnist(tmp_path)
    path = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    data = bytearray(path.read_bytes())
    data[2] = 0x42  # not a type code IDX knows
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=f"{path} is not an IDX file of 3 dimension"):
        load_dataset(cfg_for("mnist", tmp_path))


@pytest.mark.parametrize(
    "damage",
    [b"", b"\0\0\x08\x03\0\0", b"\0\0\x08\x02\0\0\0\x28\0\0\0\x1c"],
    ids=["empty", "a header cut short", "2 sizes for 3"],
)
def test_an_images_file_whose_header_is_not_one_is_named(tmp_path, damage):
    # torchvision said "invalid literal for int() with base 16" or "x should have 3 dimension instead of 2"
    write_mnist(tmp_path)
    path = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    path.write_bytes(damage)
    with pytest.raises(DataError, match=f"{path} is not an IDX file of 3 dimension"):
        load_dataset(cfg_for("mnist", tmp_path))


def test_image_and_label_counts_that_disagree_are_refused(tmp_path):
    write_mnist(tmp_path, train=40)
    write_idx(tmp_path / "MNIST" / "raw" / "train-labels-idx1-ubyte", np.arange(30) % 10)
    with pytest.raises(
        DataError, match=r"train-images-idx3-ubyte holds 40 images but \S+train-labels-idx1-ubyte holds 30"
    ):
        load_dataset(cfg_for("mnist", tmp_path))


def test_labels_outside_the_ten_classes_are_refused(tmp_path):
    write_mnist(tmp_path, train=40)
    write_idx(tmp_path / "MNIST" / "raw" / "train-labels-idx1-ubyte", np.arange(40) % 10 + 3)
    with pytest.raises(DataError, match="outside the 10 classes"):
        load_dataset(cfg_for("mnist", tmp_path))


def test_a_decompression_bomb_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "bomb.png"
    write_image(path, (64, 64))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 64 x 64 = 4096 > 2 x 1000: Pillow refuses it
    with pytest.raises(DataError, match="bomb.png is refused"):
        read_image(str(path), 3, 16)


def test_a_bad_image_read_by_a_worker_gives_the_workers_own_message(tmp_path):
    folder = tmp_path / "images"
    for i in range(40):
        write_image(folder / f"{i:03d}.png", (20, 20), seed=i)
    (folder / "010.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    dataset = load_dataset(cfg_for("folder", folder, image_size=16, in_memory=False))
    stream = BatchStream(dataset.images, 32, seed=0, device=CPU, num_workers=1)
    with pytest.raises(DataError) as caught:
        for _ in range(3):
            next(stream)
    workers = list(stream.loader._iterator._workers)
    stream.close()  # what collection or the interpreter's exit does: workers ignore SIGTERM, so are stopped
    assert not any(worker.is_alive() for worker in workers)
    message = str(caught.value)
    assert "010.png cannot be read as an image" in message
    assert "Traceback" not in message and "worker process" not in message


def test_worker_message_keeps_plain_messages():
    assert worker_message("plain") == "plain"
    pasted = (
        "Caught DataError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        "  ...\ngan.errors.DataError: x.png cannot be read"
    )
    assert worker_message(pasted) == "x.png cannot be read"


def test_a_minibatch_std_group_larger_than_the_batch_is_refused():
    from conftest import compose_config

    with pytest.raises(ConfigError, match="model.minibatch_std=64"):
        compose_config("model.minibatch_std=64")  # debug=tiny trains on batches of 32


@pytest.mark.parametrize("channels", [1, 3])
def test_a_16_bit_png_is_scaled_to_8_bits_not_clipped_to_white(tmp_path, channels):
    # Pillow's convert("L") clips a 16-bit value above 255 to 255: a whole folder of them read as white
    ramp = np.arange(256 * 256, dtype=np.uint16).reshape(256, 256)
    Image.fromarray(ramp).save(tmp_path / "ramp.png")
    pixels = read_image(str(tmp_path / "ramp.png"), channels, 256)
    assert torch.equal(pixels[0].to(torch.int64), torch.from_numpy(ramp.astype(np.int64) >> 8))


def test_an_idx_file_left_gzipped_is_named_with_what_to_do(tmp_path):
    # the download leaves FILE.gz and unpacks it; a copy of the .gz alone is not read by torchvision
    write_mnist(tmp_path)
    path = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte \(train-images-idx3-ubyte.gz is there: gunzip it"):
        load_dataset(cfg_for("mnist", tmp_path))


@pytest.mark.parametrize(
    "content, says",
    [(None, "it is empty, 0 bytes"), (torch.zeros(3), "it holds Tensor"), ({"images": 1}, "it holds ['images']")],
    ids=["empty", "a tensor", "other keys"],
)
def test_a_pack_file_that_is_no_pack_is_named_with_what_it_holds(tmp_path, content, says):
    # a tensor was indexed with "settings": torch's "too many indices" under an indexing warning
    (tmp_path / "pack.pt").write_bytes(b"") if content is None else torch.save(content, tmp_path / "pack.pt")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'pack.pt'} cannot be read as a pack ({says}")):
        load_dataset(cfg_for("packed", tmp_path, image_size=16))
