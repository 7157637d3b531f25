"""gan/core/models.py: G and D's shapes, ranges and init, DCGAN as dcgan/main.py builds it, and D's variants."""

import pytest
import torch
from torch import nn

from gan.core.models import Discriminator, Generator, MinibatchStd, num_blocks
from scripts import canonical_dcgan as canonical


@pytest.mark.parametrize("image_size", [16, 32, 64, 128])
@pytest.mark.parametrize("channels", [1, 3])
def test_shapes_and_range_and_an_image_size_not_a_power_of_two_is_refused(image_size, channels):
    G = Generator(z_dim=8, width=4, channels=channels, image_size=image_size)
    D, images = Discriminator(width=4, channels=channels, image_size=image_size), G(torch.randn(3, 8))
    assert images.shape == (3, channels, image_size, image_size)
    assert images.min() >= -1 and images.max() <= 1  # tanh output matches data in [-1, 1]
    logits, features = D(images, with_features=True)
    assert logits.shape == (3,) and features.shape[-2:] == (4, 4)
    # one block per doubling from 4 x 4, and one more convolution: G's input projection, D's head
    convs = [sum(isinstance(x, (nn.Conv2d, nn.ConvTranspose2d)) for x in m.modules()) for m in (G, D)]
    assert 4 * 2 ** num_blocks(image_size) == image_size and convs == [num_blocks(image_size) + 1] * 2
    for bad in (4, image_size + 8, 3 * image_size // 2):  # below 8, or not a power of two: refused
        pytest.raises(ValueError, Generator, image_size=bad).match("power of two")


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
    assert conv_weights.mean().abs() < 1e-3 and conv_weights.std().item() == pytest.approx(0.02, rel=0.02)
    bn = [m for m in G.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(torch.all(m.bias == 0) for m in bn)
    assert torch.cat([m.weight for m in bn]).mean().item() == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("image_size, channels", [(64, 3), (32, 1)])
def test_networks_are_pytorch_examples_layer_for_layer_but_for_ds_sigmoid(image_size, channels):
    """With the variants off: scripts/canonical_dcgan.py's netG and netD layer for layer, but D's final Sigmoid."""

    def layers(module: nn.Module) -> list[str]:
        return [repr(m) for m in module.modules() if not list(m.children()) and not isinstance(m, nn.Identity)]

    ours_g, their_g = Generator(100, 64, channels, image_size), canonical.Generator(100, 64, channels, image_size)
    assert layers(ours_g) == layers(their_g)
    theirs = layers(canonical.Discriminator(64, channels, image_size))
    assert theirs[-1] == "Sigmoid()" and layers(Discriminator(64, channels, image_size)) == theirs[:-1]


def test_spectral_norm_bounds_each_convolution_as_a_reshaped_matrix_not_on_images():
    """sigma = 1 for each (out, in*4*4) matrix; a 4x4 stride-2 conv's overlapping patches let its gain approach 2."""
    D = Discriminator(width=8, image_size=16, batchnorm=False, spectral_norm=True)
    for _ in range(20):  # one power iteration per training forward
        D(torch.randn(4, 1, 16, 16))
    sigmas = [torch.linalg.matrix_norm(m.weight.flatten(1), ord=2) for m in D.modules() if isinstance(m, nn.Conv2d)]
    assert sigmas and torch.stack(sigmas).tolist() == pytest.approx([1.0] * len(sigmas), abs=0.05)
    overlapping = nn.utils.parametrizations.spectral_norm(nn.Conv2d(1, 1, 4, stride=2, padding=1, bias=False))
    single = nn.utils.parametrizations.spectral_norm(nn.Conv2d(8, 4, 1, bias=False))
    with torch.no_grad():
        overlapping.parametrizations.weight.original.fill_(1.0)  # a spatially constant kernel: the worst case
        for conv in (overlapping, single):
            for _ in range(50):
                conv(torch.randn(1, conv.in_channels, 8, 8))  # power iterations converge to the true sigma
            conv.eval()  # from here on sigma stays as converged
        assert torch.linalg.matrix_norm(overlapping.weight.flatten(1), ord=2).item() == pytest.approx(1.0, abs=1e-3)
        flat = torch.ones(1, 1, 64, 64)
        assert (overlapping(flat).norm() / flat.norm()).item() > 1.8  # near 2: the per-layer bound is not 1
        gains = [(single(x).norm() / x.norm()).item() for x in torch.randn(20, 1, 8, 8, 8)]
        assert max(gains) <= 1.0 + 1e-3


def test_pack_and_minibatch_std_in_discriminator_known_values_and_a_collapsed_batch():
    D = Discriminator(width=8, image_size=16, pack=2)
    assert D(torch.randn(8, 1, 16, 16)).shape == (4,)
    D = Discriminator(width=8, image_size=16, minibatch_std=4)
    assert D.head.in_channels == 8 * 2 + 1 and D(torch.randn(8, 1, 16, 16)).shape == (8,)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(D(torch.randn(8, 1, 16, 16)).float()).all()
    # 4 samples, groups of 2 in StyleGAN2-ADA's layout: {0, 2} and {1, 3}
    x = torch.stack([torch.full((3, 2, 2), v) for v in (0.0, 5.0, 2.0, 5.0)])
    out = MinibatchStd(group_size=2)(x)
    assert out.shape == (4, 4, 2, 2)
    torch.testing.assert_close(out[:, :3], x)  # the features pass through
    extra = out[:, 3, 0, 0]
    assert extra.tolist() == pytest.approx([1.0, 1e-4, 1.0, 1e-4])  # the std of 0 and 2; of 5 and 5, sqrt(0 + eps)
    assert (out[:, 3] == extra.view(4, 1, 1)).all()  # one constant channel per sample
    layer = MinibatchStd(group_size=4)
    varied, collapsed = torch.randn(8, 16, 4, 4), torch.randn(1, 16, 4, 4).expand(8, 16, 4, 4)
    assert layer(varied)[:, -1].min() > 0.5 and layer(collapsed)[:, -1].max() < 1e-3
    # the channel couples the samples of a group and only those: a sample's gradient reaches its
    # group mates (n, n + 2, n + 4, n + 6 for 8 samples in groups of 4), never the other group
    x = torch.randn(8, 16, 4, 4, requires_grad=True)
    layer(x)[0, -1].sum().backward()
    touched = x.grad.flatten(1).abs().sum(1) > 0
    assert touched.tolist() == [True, False, True, False, True, False, True, False]
    assert layer(torch.randn(6, 2, 4, 4)).shape == (6, 3, 4, 4)  # gcd(6, 4) = 2
