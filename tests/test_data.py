"""Unit tier: the built-in digits and the resumable batch stream."""

from __future__ import annotations

import pytest
import torch

from gan.config import DataConfig
from gan.data import BatchStream, DataError, load_dataset, render_digits, to_unit_range


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
    center, border = mean[size // 4: -size // 4, size // 4: -size // 4].mean(), mean[0].mean()
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


def test_unknown_dataset_and_wrong_channels_are_refused():
    with pytest.raises(DataError, match="data.channels=1"):
        load_dataset(DataConfig(channels=3))


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
