"""Unit tier: the built-in digits, the pixel rules every dataset shares, and the resumable batch stream."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from gan.config import DataConfig
from gan.data import BatchStream, DataError, convert_channels, fit_square, load_dataset, render_digits, to_unit_range


def test_digits_are_deterministic_labelled_and_in_range():
    images, labels = render_digits(500, 32, seed=7)
    again, labels_again = render_digits(500, 32, seed=7)
    assert torch.equal(images, again) and torch.equal(labels, labels_again)
    assert images.shape == (500, 1, 32, 32) and images.dtype == torch.uint8
    assert set(labels.tolist()) == set(range(10))
    assert not torch.equal(render_digits(500, 32, seed=8)[0], images)


@pytest.mark.parametrize("size", [16, 32, 64])
def test_digits_render_at_any_size_with_ink_in_the_middle(size):
    images, _ = render_digits(64, size, seed=0)
    mean = images.float().mean(0)[0]
    center, border = mean[size // 4 : -size // 4, size // 4 : -size // 4].mean(), mean[0].mean()
    assert center > 3 * border  # the digit, not the noise, carries the ink


def test_classes_differ_from_each_other():
    images, labels = render_digits(2000, 32, seed=0)
    means = torch.stack([images[labels == c].float().mean(0) for c in range(10)])
    distances = torch.cdist(means.flatten(1), means.flatten(1))
    assert distances[~torch.eye(10, dtype=torch.bool)].min() > 50  # ten distinct average shapes


def test_held_out_split_differs_from_training_split():
    cfg = DataConfig(num_samples=600)
    train, held_out = load_dataset(cfg), load_dataset(cfg, train=False)
    assert held_out.images.size(0) == 100
    assert not any(torch.equal(held_out.images[0], image) for image in train.images)


def test_unknown_dataset_is_refused_and_digits_convert_to_rgb():
    with pytest.raises(DataError, match="not a known dataset"):
        load_dataset(DataConfig(name="nosuch"))  # check() would refuse it first; the loader does too
    gray = load_dataset(DataConfig(num_samples=64)).images
    rgb = load_dataset(DataConfig(channels=3, num_samples=64)).images
    assert rgb.shape == (64, 3, 32, 32) and all(torch.equal(rgb[:, c : c + 1], gray) for c in range(3))


@pytest.mark.parametrize("height, width", [(28, 28), (218, 178), (12, 40)])
def test_fit_square_resizes_the_shorter_side_then_crops_the_centre(height, width):
    images = torch.zeros(2, 1, height, width, dtype=torch.uint8)
    images[..., height // 2 :, :] = 200  # bottom half bright: the crop keeps the middle rows
    out = fit_square(images, 16)
    assert out.shape == (2, 1, 16, 16) and out.dtype == torch.uint8
    assert out[..., :7, :].max() < 50 and out[..., 9:, :].min() > 150
    same = torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8)
    assert fit_square(same, 16) is same  # already that size: untouched, not resampled


def test_rgb_to_gray_is_pillows_luma_to_the_byte():
    pixels = torch.randint(0, 256, (64, 64, 3), dtype=torch.uint8)
    pixels[0, 0] = 255  # white stays 255: the rounding constant must not overflow a byte
    pillow = torch.tensor(np.asarray(Image.fromarray(pixels.numpy()).convert("L")))
    rgb = pixels.permute(2, 0, 1)
    assert torch.equal(convert_channels(rgb, 1)[0], pillow)
    assert convert_channels(rgb, 3) is rgb  # already RGB: untouched


def test_unit_range():
    images = torch.tensor([0, 255], dtype=torch.uint8)
    assert to_unit_range(images).tolist() == [-1.0, 1.0]


@pytest.mark.parametrize("workers", [0, 1])
def test_batch_stream_covers_each_epoch_once_and_resumes_exactly(workers):
    images = torch.arange(10, dtype=torch.uint8).view(10, 1, 1, 1)
    stream = BatchStream(images, batch_size=3, seed=0, device=torch.device("cpu"), num_workers=workers)
    epoch0 = torch.cat([next(stream) for _ in range(3)])  # 3 full batches; the 10th image is dropped
    assert len(set(epoch0.flatten().tolist())) == 9
    state = stream.state_dict()
    assert state == {"epoch": 0, "batch": 3}
    following = [next(stream) for _ in range(4)]
    assert stream.epoch == 2  # 3 batches an epoch: the 4 batches cross into epoch 2
    resumed = BatchStream(images, batch_size=3, seed=0, device=torch.device("cpu"), num_workers=workers)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, next(resumed)) for a in following)


@pytest.mark.parametrize("name, channels", [("digits", 1), ("stacked", 3)])
@pytest.mark.parametrize("in_memory", [True, False])
def test_limit_keeps_the_first_images_with_their_labels_and_the_whole_held_out_split(name, channels, in_memory):
    cfg = DataConfig(name=name, channels=channels, num_samples=240, in_memory=in_memory)
    limited_cfg = DataConfig(name=name, channels=channels, num_samples=240, in_memory=in_memory, limit=64)
    full, limited = load_dataset(cfg), load_dataset(limited_cfg)
    assert len(limited.images) == limited.labels.numel() == 64 and limited.num_classes == full.num_classes
    assert torch.equal(limited.labels, full.labels[:64])
    assert all(torch.equal(limited.images[i], full.images[i]) for i in (0, 31, 63))  # tensor or streamed source
    held_out = load_dataset(limited_cfg, train=False)
    assert held_out.labels.numel() == 40 and torch.equal(held_out.labels, load_dataset(cfg, train=False).labels)


def test_limit_slices_a_streamed_folder_with_its_labels(tmp_path):
    for i in range(16):  # two classes, so the labels can go wrong
        (tmp_path / f"class_{i % 2}").mkdir(exist_ok=True)
        Image.fromarray(np.full((20, 20), 10 * i, dtype=np.uint8)).save(tmp_path / f"class_{i % 2}" / f"{i:02d}.png")
    cfg = DataConfig(name="folder", root=str(tmp_path), image_size=16, in_memory=False)
    full, limited = load_dataset(cfg), load_dataset(dataclasses.replace(cfg, limit=10))
    assert limited.images.paths == full.images.paths[:10] and torch.equal(limited.labels, full.labels[:10])
    assert 0 < full.labels[:10].sum() < 10  # the first ten span both classes
