"""Generator and Discriminator of DCGAN (Radford et al. 2015), for any power-of-two image size.

Owns the architectures and their weight init. Knows nothing of configs, losses or training: every
size is a typed constructor argument. D returns logits (no Sigmoid): the losses in `gan.core.losses`
use the with-logits forms, which are stable and safe under autocast (pytorch#61098).

Shapes for a 32 x 32 grayscale model of width 64 (the DCGAN paper's; the default width, 32, halves
every channel count):
    G: z 100 -> 256 x 4 x 4 -> 128 x 8 x 8 -> 64 x 16 x 16 -> 1 x 32 x 32
    D: 1 x 32 x 32 -> 64 x 16 x 16 -> 128 x 8 x 8 -> 256 x 4 x 4 -> logit
Each extra doubling of image_size adds one block to each network (pytorch/examples#70 asked for
other sizes than 64).

Class-conditional (num_classes > 0, model.conditional): G(z, y) reads a one-hot code of the class
y next to z, and D(x, y) is a projection discriminator (Miyato & Koyama 2018). With num_classes=0
(the default) neither network differs from DCGAN's, and y must be None.
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


class Generator(nn.Module):
    """z (N, z_dim) [, classes y (N,)] -> images (N, channels, image_size, image_size) in [-1, 1].

    num_classes > 0: G(z, y) is conditional. The class enters once, at the input: its one-hot code,
    num_classes numbers, is concatenated to z, and the DCGAN trunk is unchanged but for the first
    layer's input channels (cGAN, Mirza & Osindero 2014). The code is small next to z (norm 1
    against about sqrt(z_dim) = 10), so G keeps drawing its variety from z and learns the class
    from D's pressure. A learned embedding as large as z (N(0, 1), z_dim numbers) was tried first:
    G then used the class code as its latent and ignored z, one image per class (docs/conditional.md).
    Conditional BatchNorm (BigGAN's way: a class-dependent scale and shift in every BatchNorm
    layer) conditions more strongly, but replaces each BatchNorm2d with a module of its own and
    spreads y through the whole network; for a lesson, one concatenation says what conditioning is.
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
        if self.num_classes:  # the class as num_classes more inputs: (N, z_dim + num_classes)
            if y is None:
                raise ValueError("this generator is class-conditional: call it as G(z, y) with the classes y")
            z = torch.cat([z, F.one_hot(y, self.num_classes).to(z.dtype)], dim=1)
        return self.net(z.view(z.size(0), z.size(1), 1, 1))


class Discriminator(nn.Module):
    """images (N, channels, S, S) [, classes y (N,)] -> logits (N / pack,); with_features=True also
    returns the trunk's output.

    batchnorm=False: no normalisation (for per-sample penalties; convolutions then get a bias).
    spectral_norm=True: each convolution's weight divided by its largest singular value (Miyato et
    al. 2018), torch's parametrization, estimated by one power iteration per training forward.
    pack=m: PacGAN (Lin et al. 2018): m consecutive samples are stacked along channels and judged
    together, so a D that sees m fakes at once can tell when they all look alike.
    minibatch_std=g: ProGAN's minibatch standard deviation (Karras et al. 2018, sec. 3), see
    MinibatchStd; 0 = off.
    num_classes > 0: a projection discriminator (Miyato & Koyama 2018),
        logit = psi(phi(x)) + <embed(y), phi(x)>,
    with phi(x) D's trunk output (ch x 4 x 4), psi DCGAN's own head (a 4x4 convolution over it, i.e.
    a linear function of it) and embed(y) one learned ch x 4 x 4 tensor per class. The second term
    asks "does x look like class y?" in D's own feature space; the paper derives it as the log of the
    ratio of the class-conditional densities, and it beats feeding y to D's input (the cGAN way).
    The embedding starts as N(0, 0.02), the head's init, so both terms start equally small.
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
        # no BatchNorm on D's input layer (DCGAN paper, sec. 3)
        convs = [nn.Conv2d(channels * pack, width, 4, 2, 1, bias=not batchnorm)]
        layers: list[nn.Module] = [convs[-1], nn.LeakyReLU(0.2, True)]
        ch = width
        for _ in range(blocks - 1):
            convs.append(nn.Conv2d(ch, ch * 2, 4, 2, 1, bias=not batchnorm))
            layers += [convs[-1], nn.BatchNorm2d(ch * 2) if batchnorm else nn.Identity(), nn.LeakyReLU(0.2, True)]
            ch *= 2
        self.features = nn.Sequential(*layers)  # state size: ch x 4 x 4
        self.minibatch_std = MinibatchStd(minibatch_std) if minibatch_std else nn.Identity()
        head_in = ch + 1 if minibatch_std else ch  # the minibatch-stddev channel, when on
        self.head = nn.Conv2d(head_in, 1, 4, 1, 0, bias=False)  # a logit; no Sigmoid (see module docstring)
        self.apply(dcgan_init_)
        # the projection's class embeddings (num_classes x ch*4*4); none at all when unconditional
        self.embed = nn.Embedding(num_classes, ch * 4 * 4) if num_classes else None
        if self.embed is not None:
            nn.init.normal_(self.embed.weight, 0.0, 0.02)
        if spectral_norm:  # the embedding too, as Miyato & Koyama normalise it
            for layer in [*convs, self.head, *([self.embed] if self.embed is not None else [])]:
                nn.utils.parametrizations.spectral_norm(layer)

    def forward(
        self, x: Tensor, y: Optional[Tensor] = None, with_features: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """logits (N,); with_features=True: (logits, features (N, ch, 4, 4)) for feature matching.

        `y`: the classes of x, for a conditional D (None otherwise). with_features is a keyword of
        forward() rather than a second method, so that a DistributedDataParallel wrapper, which
        only intercepts forward(), passes it through.
        """
        if self.pack > 1:  # (N, C, H, W) -> (N / pack, pack * C, H, W): consecutive samples together
            x = x.reshape(x.size(0) // self.pack, self.pack * x.size(1), *x.shape[2:])
        features = self.features(x)
        logits = self.head(self.minibatch_std(features)).flatten()  # psi(phi(x))
        if self.embed is not None:
            if y is None:
                raise ValueError("this discriminator is class-conditional: call it as D(x, y) with the classes y")
            # + <embed(y), phi(x)>: one dot product per image over its ch x 4 x 4 features
            logits = logits + (self.embed(y).to(features.dtype) * features.flatten(1)).sum(dim=1)
        return (logits, features) if with_features else logits


class MinibatchStd(nn.Module):
    """(N, C, H, W) -> (N, C + 1, H, W): appends the standard deviation of the features across a
    group of samples, averaged over features and positions, as one constant channel.

    Why (Karras et al. 2018, "Progressive Growing of GANs", sec. 3): a D that judges samples one at
    a time cannot see that a batch of fakes lacks the variety of a batch of reals; this channel
    lets it. Groups follow StyleGAN2-ADA's layout: sample n is grouped with n + N/g, n + 2N/g, ...
    (a group size that does not divide N shrinks to the largest one that does). The statistic is
    computed in float32: under bf16 autocast a variance of small differences loses its digits.
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


@torch.no_grad()
def dcgan_init_(module: nn.Module) -> None:
    """Weights ~ N(0, 0.02); BatchNorm scale ~ N(1, 0.02), shift 0 (Radford et al. 2015, sec. 4)."""
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)
