"""Damaged datasets: every case is a DataError (or a ConfigError) whose one paragraph names the file
and what is wrong, never a bare AssertionError, a worker's pasted traceback or a silent acceptance."""

from __future__ import annotations

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
    with pytest.raises(DataError, match="was refused") as caught:
        load_dataset(cfg_for("mnist", tmp_path))
    assert str(caught.value).strip()  # a sentence, not an empty AssertionError


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
