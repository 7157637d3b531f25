"""Generator and Discriminator of DCGAN (Radford et al. 2015), for any power-of-two image size.

Owns the architectures and their weight init. Knows nothing of configs, losses or training: every
size is a typed constructor argument. Read it in two parts:

1. DCGAN, as pytorch/examples' dcgan/main.py builds it: `Generator`, `Discriminator` and
   `dcgan_init_`. At the same image size, channels and width the two networks are that example's
   layer for layer, with one change: D returns logits, not probabilities (no Sigmoid), so that the
   losses in `gan.core.losses` can use the with-logits forms, which are exact where a sigmoid
   saturates and safe under autocast (pytorch#61098).
2. Variants, under the heading "Variants" below: options of the config, each a constructor
   argument, off by default here, that adds a few lines to the DCGAN code (class-conditional G and
   projection D, ProGAN's minibatch standard deviation, PacGAN's packing, spectral norm, D without
   BatchNorm). Skip them on a first read, but for one thing: train.py's default D is spectrally
   normalised and has no BatchNorm (`spectral_norm_`; gan/config.py:ModelConfig says why).

Shapes for a 32 x 32 grayscale model of width 64 (pytorch/examples' default width, its ngf and ndf;
this project's default, 32, halves every channel count; the DCGAN paper's LSUN generator, its
Figure 1, starts from 1024 channels at 4 x 4 for 64 px images, which is width 128 here):
    G: z 100 -> 256 x 4 x 4 -> 128 x 8 x 8 -> 64 x 16 x 16 -> 1 x 32 x 32
    D: 1 x 32 x 32 -> 64 x 16 x 16 -> 128 x 8 x 8 -> 256 x 4 x 4 -> logit
Each extra doubling of image_size adds one block to each network (pytorch/examples#70 asked for
other sizes than 64).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def num_blocks(image_size: int) -> int:
    """Resolution doublings between 4 x 4 and image_size (3 for 32 px)."""
    if image_size < 8 or image_size & (image_size - 1):
        raise ValueError(f"image_size must be a power of two >= 8, got {image_size}")
    return int(math.log2(image_size)) - 2


# DCGAN --------------------------------------------------------------------------------------------


class Generator(nn.Module):
    """z (N, z_dim) -> images (N, channels, image_size, image_size) in [-1, 1].

    DCGAN's generator: a stack of transposed convolutions, each doubling the side, with BatchNorm
    and ReLU between them and tanh at the end (Radford et al. 2015, sec. 3).

    num_classes > 0 makes it conditional, G(z, y) (a variant: see `append_class_code`); the DCGAN
    trunk then differs only in its first layer's input channels.
    """

    def __init__(
        self, z_dim: int = 100, width: int = 64, channels: int = 1, image_size: int = 32, num_classes: int = 0
    ):
        super().__init__()
        self.z_dim, self.num_classes = z_dim, num_classes
        blocks = num_blocks(image_size)
        ch = width * 2 ** (blocks - 1)
        # state size: ch x 4 x 4 (a 4x4 transposed conv on a 1x1 input is a dense projection)
        layers: list[nn.Module] = [
            nn.ConvTranspose2d(z_dim + num_classes, ch, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ch),
            nn.ReLU(True),
        ]
        for _ in range(blocks - 1):
            # state size: ch/2 x 2s x 2s; no bias, BatchNorm's shift replaces it
            layers += [nn.ConvTranspose2d(ch, ch // 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ch // 2), nn.ReLU(True)]
            ch //= 2
        # state size: channels x image_size x image_size; tanh matches data scaled to [-1, 1]
        layers += [nn.ConvTranspose2d(ch, channels, 4, 2, 1, bias=False), nn.Tanh()]
        self.net = nn.Sequential(*layers)
        self.apply(dcgan_init_)

    def forward(self, z: Tensor, y: Optional[Tensor] = None) -> Tensor:
        if self.num_classes:  # the conditional variant: (N, z_dim) -> (N, z_dim + num_classes)
            z = append_class_code(z, y, self.num_classes)
        # view, not reshape: adding size-1 dimensions never needs a copy, whatever z's strides
        return self.net(z.view(z.size(0), z.size(1), 1, 1))


class Discriminator(nn.Module):
    """images (N, channels, S, S) -> logits (N,); with_features=True also returns the trunk's
    output, D's last features (N, ch, 4, 4), which feature matching compares.

    DCGAN's discriminator: strided convolutions, each halving the side, with BatchNorm (except on
    the input layer) and LeakyReLU(0.2) between them, and one 4 x 4 convolution to a logit.

    The other arguments are variants (see "Variants" below), all off by default:
    batchnorm=False drops BatchNorm (for per-sample penalties; the convolutions then get a bias);
    spectral_norm, pack, minibatch_std and num_classes are described where their code is:
    `spectral_norm_`, `pack_samples`, `MinibatchStd`, `projection`.
    """

    def __init__(
        self,
        width: int = 64,
        channels: int = 1,
        image_size: int = 32,
        batchnorm: bool = True,
        spectral_norm: bool = False,
        pack: int = 1,
        minibatch_std: int = 0,
        num_classes: int = 0,
    ):
        super().__init__()
        self.pack = pack
        blocks = num_blocks(image_size)
        # no BatchNorm on D's input layer (DCGAN paper, sec. 3); `pack` images arrive as one (PacGAN)
        convs = [nn.Conv2d(channels * pack, width, 4, 2, 1, bias=not batchnorm)]
        layers: list[nn.Module] = [convs[-1], nn.LeakyReLU(0.2, True)]
        ch = width
        for _ in range(blocks - 1):
            convs.append(nn.Conv2d(ch, ch * 2, 4, 2, 1, bias=not batchnorm))
            layers += [convs[-1], nn.BatchNorm2d(ch * 2) if batchnorm else nn.Identity(), nn.LeakyReLU(0.2, True)]
            ch *= 2
        self.features = nn.Sequential(*layers)  # state size: ch x 4 x 4
        # variant: one more channel, the minibatch standard deviation; the identity when off
        self.minibatch_std = MinibatchStd(minibatch_std) if minibatch_std else nn.Identity()
        head_in = ch + 1 if minibatch_std else ch
        self.head = nn.Conv2d(head_in, 1, 4, 1, 0, bias=False)  # a logit; no Sigmoid (see module docstring)
        self.apply(dcgan_init_)
        # variant: the projection's class embeddings (num_classes x ch*4*4); None when unconditional
        self.embed = class_embeddings(num_classes, ch * 4 * 4)
        if spectral_norm:
            spectral_norm_([*convs, self.head, *([self.embed] if self.embed is not None else [])])

    def forward(
        self, x: Tensor, y: Optional[Tensor] = None, with_features: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """logits (N,); with_features=True: (logits, features (N, ch, 4, 4)) for feature matching.

        `y`: the classes of x, for a conditional D (None otherwise). with_features is a keyword of
        forward() rather than a second method, so that a DistributedDataParallel wrapper, which
        only intercepts forward(), passes it through.
        """
        if self.pack > 1:  # variant: PacGAN
            x = pack_samples(x, self.pack)
        features = self.features(x)
        logits = self.head(self.minibatch_std(features)).flatten()  # psi(phi(x)), DCGAN's logit
        if self.embed is not None:  # variant: the projection discriminator's class term
            logits = logits + projection(self.embed, y, features)
        return (logits, features) if with_features else logits


@torch.no_grad()
def dcgan_init_(module: nn.Module) -> None:
    """Convolution weights ~ N(0, 0.02) (the DCGAN paper, sec. 4: "all weights" from a zero-centred
    normal with standard deviation 0.02); BatchNorm scale ~ N(1, 0.02) and shift 0, as
    pytorch/examples' weights_init does (the paper says nothing of BatchNorm's scale and shift)."""
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


# Variants -----------------------------------------------------------------------------------------
# Each is a config option, off by default in these constructors; with all of them off, G and D above
# are DCGAN's. The config turns two on by default: spectral norm, and D without BatchNorm.


def append_class_code(z: Tensor, y: Optional[Tensor], num_classes: int) -> Tensor:
    """Conditional G (model.conditional): z (N, z_dim) and classes y (N,) -> (N, z_dim + num_classes).

    The class enters once, at the input: its one-hot code, num_classes numbers, is concatenated to
    z, and the DCGAN trunk is unchanged but for the first layer's input channels (cGAN, Mirza &
    Osindero 2014). The code is small next to z (norm 1 against about sqrt(z_dim) = 10), so G keeps
    drawing its variety from z and learns the class from D's pressure. A learned embedding as large
    as z (N(0, 1), z_dim numbers) was tried first: G then used the class code as its latent and
    ignored z, one image per class (docs/conditional.md). Conditional BatchNorm (BigGAN's way: a
    class-dependent scale and shift in every BatchNorm layer) conditions more strongly, but replaces
    each BatchNorm2d with a module of its own and spreads y through the whole network; for a lesson,
    one concatenation says what conditioning is.
    """
    if y is None:
        raise ValueError("this generator is class-conditional: call it as G(z, y) with the classes y")
    return torch.cat([z, F.one_hot(y, num_classes).to(z.dtype)], dim=1)


def class_embeddings(num_classes: int, size: int) -> Optional[nn.Embedding]:
    """The projection discriminator's embed(y), one learned vector of D's feature size per class, or
    None when unconditional (so an unconditional D has no such module and no such state_dict key).
    It starts as N(0, 0.02), the head's init, so the two terms of the logit start equally small."""
    if not num_classes:
        return None
    embed = nn.Embedding(num_classes, size)
    nn.init.normal_(embed.weight, 0.0, 0.02)
    return embed


def projection(embed: nn.Embedding, y: Optional[Tensor], features: Tensor) -> Tensor:
    """The class term of a projection discriminator (Miyato & Koyama 2018, model.conditional):

        logit = psi(phi(x)) + <embed(y), phi(x)>,

    with phi(x) D's trunk output (ch x 4 x 4), psi DCGAN's own head (a 4x4 convolution over it, i.e.
    a linear function of it) and embed(y) one learned ch x 4 x 4 tensor per class. This returns the
    second term, one dot product per image: it asks "does x look like class y?" in D's own feature
    space. The paper derives it as the log of the ratio of the class-conditional densities, and it
    beats feeding y to D's input (the cGAN way).
    """
    if y is None:
        raise ValueError("this discriminator is class-conditional: call it as D(x, y) with the classes y")
    return (embed(y).to(features.dtype) * features.flatten(1)).sum(dim=1)


def pack_samples(x: Tensor, pack: int) -> Tensor:
    """PacGAN (Lin et al. 2018, model.pack): (N, C, H, W) -> (N / pack, pack * C, H, W), each group
    of `pack` consecutive samples stacked along channels and judged together as one. A D that sees
    several fakes at once can tell when they all look alike, which penalises mode collapse (G
    drawing a few kinds of image whatever z is)."""
    return x.reshape(x.size(0) // pack, pack * x.size(1), *x.shape[2:])


def spectral_norm_(layers: list[nn.Module]) -> None:
    """Spectral norm (Miyato et al. 2018, model.spectral_norm): each layer's weight divided by its
    largest singular value, torch's parametrization, estimated by one power iteration per training
    forward. The projection's embedding too, as Miyato & Koyama normalise it.

    Why it is train.py's default: each weight, reshaped to a matrix as the paper does, then has
    largest singular value 1, which bounds D's slope against its input, so D cannot grow
    arbitrarily sharp. Trained 4x its length on
    Fashion-MNIST, DCGAN's BatchNorm D won little by little and the samples decayed; this D never
    got ahead (docs/results.md, "Training longer"). It is used without BatchNorm, which would
    rescale each layer after the normalisation and undo the bound."""
    for layer in layers:
        nn.utils.parametrizations.spectral_norm(layer)


class MinibatchStd(nn.Module):
    """(N, C, H, W) -> (N, C + 1, H, W): appends the standard deviation of the features across a
    group of samples, averaged over features and positions, as one constant channel
    (model.minibatch_std=g, the group size; 0 = off).

    Why (Karras et al. 2018, "Progressive Growing of GANs" (ProGAN), sec. 3): a D that judges samples
    one at a time cannot see that a batch of fakes lacks the variety of a batch of reals; this
    channel lets it. Groups follow StyleGAN2-ADA's layout: sample n is grouped with n + N/g,
    n + 2N/g, ... A group size g that does not divide N shrinks to gcd(N, g) (5 at N = 16: groups of
    one sample, a constant channel), so training refuses such a g against its batch
    (gan/config.py:check_minibatch_std); the shrink remains for a short last chunk, such as the
    overfitting probe's (gan/training/overfit.py). The statistic is computed in float32: under bf16
    autocast a variance of small differences loses its digits.
    """

    def __init__(self, group_size: int = 4):
        super().__init__()
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        self.group_size = group_size

    def forward(self, x: Tensor) -> Tensor:
        n, c, h, w = x.shape
        g = math.gcd(n, self.group_size)
        y = x.float().reshape(g, n // g, c, h, w)  # y[i, m] is sample i * (n // g) + m
        y = (y - y.mean(dim=0)).square().mean(dim=0).add(1e-8).sqrt()  # std over each group
        y = y.mean(dim=(1, 2, 3)).to(x.dtype)  # (n // g,): one number per group
        y = y.reshape(-1, 1, 1, 1).repeat(g, 1, h, w)  # back to sample order: row i * (n // g) + m
        return torch.cat([x, y], dim=1)

    def extra_repr(self) -> str:
        return f"group_size={self.group_size}"
