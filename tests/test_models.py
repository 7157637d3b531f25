"""Unit tier: shapes, ranges and initialisation of G and D at several image sizes, and what
gan/core/models.py's docstring says of them: DCGAN as pytorch/examples' dcgan/main.py builds it."""

import pytest
import torch
from torch import nn

from gan.core.models import Discriminator, Generator, num_blocks
from scripts import canonical_dcgan as canonical


@pytest.mark.parametrize("image_size", [16, 32, 64, 128])
@pytest.mark.parametrize("channels", [1, 3])
def test_shapes_and_range(image_size, channels):
    G = Generator(z_dim=8, width=4, channels=channels, image_size=image_size)
    D = Discriminator(width=4, channels=channels, image_size=image_size)
    images = G(torch.randn(3, 8))
    assert images.shape == (3, channels, image_size, image_size)
    assert images.min() >= -1 and images.max() <= 1  # tanh output matches data in [-1, 1]
    logits, features = D(images, with_features=True)
    assert logits.shape == (3,)
    assert features.shape[-2:] == (4, 4)


def test_one_block_per_doubling():
    convs = lambda m: sum(isinstance(x, (nn.Conv2d, nn.ConvTranspose2d)) for x in m.modules())  # noqa: E731
    assert num_blocks(32) == 3 and num_blocks(64) == 4
    assert convs(Generator(image_size=64)) == convs(Generator(image_size=32)) + 1
    assert convs(Discriminator(image_size=64)) == convs(Discriminator(image_size=32)) + 1


@pytest.mark.parametrize("bad", [0, 24, 28, 100])
def test_image_size_must_be_power_of_two(bad):
    with pytest.raises(ValueError, match="power of two"):
        Generator(image_size=bad)


def test_discriminator_returns_logits_not_probabilities():
    D = Discriminator(width=8, image_size=16)
    assert not any(isinstance(m, nn.Sigmoid) for m in D.modules())
    with torch.no_grad():
        D.head.weight.mul_(1000)  # large weights: logits leave [0, 1], a probability could not
        logits = D(torch.randn(16, 1, 16, 16))
    assert (logits < 0).any() and (logits > 1).any()


def test_dcgan_init():
    G = Generator(z_dim=100, width=64, image_size=64)
    conv_weights = torch.cat([m.weight.flatten() for m in G.modules() if isinstance(m, nn.ConvTranspose2d)])
    assert conv_weights.mean().abs() < 1e-3
    assert conv_weights.std().item() == pytest.approx(0.02, rel=0.02)
    bn = [m for m in G.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(torch.all(m.bias == 0) for m in bn)
    assert torch.cat([m.weight for m in bn]).mean().item() == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("image_size, channels", [(64, 3), (32, 1)])
def test_networks_are_pytorch_examples_layer_for_layer_but_for_ds_sigmoid(image_size, channels):
    """With the variants off, G and D are main.py's netG and netD (scripts/canonical_dcgan.py rewrites
    them), layer for layer at the same width; D ends in a logit instead of main.py's nn.Sigmoid, and
    its minibatch-stddev slot is an Identity."""

    def layers(module: nn.Module) -> list[str]:
        return [repr(m) for m in module.modules() if not list(m.children()) and not isinstance(m, nn.Identity)]

    ours_g, their_g = Generator(100, 64, channels, image_size), canonical.Generator(100, 64, channels, image_size)
    assert layers(ours_g) == layers(their_g)
    theirs = layers(canonical.Discriminator(64, channels, image_size))
    assert theirs[-1] == "Sigmoid()"
    assert layers(Discriminator(64, channels, image_size)) == theirs[:-1]
