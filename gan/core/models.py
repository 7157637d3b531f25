"""Generator and Discriminator of DCGAN (Radford et al. 2015), for any power-of-two image size.

`Generator`, `Discriminator` and `dcgan_init_` are pytorch/examples' dcgan/main.py layer for layer,
with one change: D returns logits, not probabilities (no Sigmoid), so the losses can use the
with-logits forms, exact where a sigmoid saturates and safe under autocast (pytorch#61098). The
variants (each a config option, marked "variant") are off by default here; skip them on a first read.

Shapes for a 32 x 32 grayscale model of width 64 (pytorch/examples' ngf and ndf):
    G: z 100 -> 256 x 4 x 4 -> 128 x 8 x 8 -> 64 x 16 x 16 -> 1 x 32 x 32
    D: 1 x 32 x 32 -> 64 x 16 x 16 -> 128 x 8 x 8 -> 256 x 4 x 4 -> logit"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def num_blocks(image_size: int) -> int:
    """Resolution doublings between 4 x 4 and image_size (3 for 32 px)."""
    if image_size < 8 or image_size & (image_size - 1):
        raise ValueError(f"image_size must be a power of two >= 8, got {image_size}")
    return int(math.log2(image_size)) - 2


class Generator(nn.Module):
    """z (N, z_dim) -> images (N, channels, image_size, image_size) in [-1, 1]: transposed convolutions,
    each doubling the side, with BatchNorm and ReLU between them and tanh at the end (Radford et al.
    2015, sec. 3). num_classes > 0 makes it conditional, G(z, y)."""

    def __init__(
        self, z_dim: int = 100, width: int = 64, channels: int = 1, image_size: int = 32, num_classes: int = 0
    ):
        super().__init__()
        self.z_dim, self.num_classes = z_dim, num_classes
        blocks = num_blocks(image_size)
        ch = width * 2 ** (blocks - 1)
        # state size: ch x 4 x 4 (a 4x4 transposed conv on a 1x1 input is a dense projection)
        layers = [nn.ConvTranspose2d(z_dim + num_classes, ch, 4, 1, 0, bias=False), nn.BatchNorm2d(ch), nn.ReLU(True)]
        for _ in range(blocks - 1):
            # state size: ch/2 x 2s x 2s; no bias, BatchNorm's shift replaces it
            layers += [nn.ConvTranspose2d(ch, ch // 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ch // 2), nn.ReLU(True)]
            ch //= 2
        # state size: channels x image_size x image_size; tanh matches data scaled to [-1, 1]
        layers += [nn.ConvTranspose2d(ch, channels, 4, 2, 1, bias=False), nn.Tanh()]
        self.net = nn.Sequential(*layers)
        self.apply(dcgan_init_)

    def forward(self, z: Tensor, y: Tensor | None = None) -> Tensor:
        # the conditional variant (model.conditional; cGAN, Mirza & Osindero 2014; docs/conditional.md): the one-hot
        # class code of y (N,) concatenated to z, (N, z_dim) -> (N, z_dim + num_classes)
        if self.num_classes:
            if y is None:
                raise ValueError("this generator is class-conditional: call it as G(z, y) with the classes y")
            z = torch.cat([z, F.one_hot(y, self.num_classes).to(z.dtype)], dim=1)
        # view, not reshape: adding size-1 dimensions never needs a copy, whatever z's strides
        return self.net(z.view(z.size(0), z.size(1), 1, 1))


class Discriminator(nn.Module):
    """images (N, channels, S, S) -> logits (N,): strided convolutions, each halving the side, with
    BatchNorm (except on the input layer) and LeakyReLU(0.2) between them, and one 4 x 4 convolution to
    a logit. The other arguments are the variants below; batchnorm=False drops BatchNorm."""

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
        # variant: the projection discriminator's embed(y), one vector of D's feature size per class (None when
        # unconditional); N(0, 0.02), the head's init, so the two terms of the logit start equally small
        self.embed = nn.Embedding(num_classes, ch * 4 * 4) if num_classes else None
        if self.embed is not None:
            nn.init.normal_(self.embed.weight, 0.0, 0.02)
        # variant: spectral norm (Miyato et al. 2018): each weight, as an (out, in*k*k) matrix, divided by its largest
        # singular value (one power iteration per training forward). That bounds each layer's slope: 1 for the matrix,
        # up to 2 for a 4x4 stride-2 convolution, whose patches overlap. Used without BatchNorm, which would undo the
        # bound (docs/results.md#adams-beta1-for-the-spectrally-normalised-d).
        if spectral_norm:
            for layer in [*convs, self.head, *([self.embed] if self.embed is not None else [])]:
                nn.utils.parametrizations.spectral_norm(layer)

    def forward(
        self, x: Tensor, y: Tensor | None = None, with_features: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """logits (N,); with_features=True: (logits, features (N, ch, 4, 4)) for feature matching,
        a keyword of forward() so that a DistributedDataParallel wrapper passes it through."""
        # variant: PacGAN (Lin et al. 2018): `pack` consecutive samples stacked along channels and judged as one, so
        # D can tell when several fakes all look alike, which penalises mode collapse
        if self.pack > 1:
            x = x.reshape(x.size(0) // self.pack, self.pack * x.size(1), *x.shape[2:])
        features = self.features(x)
        logits = self.head(self.minibatch_std(features)).flatten()  # psi(phi(x)), DCGAN's logit
        # variant: the class term of a projection discriminator (Miyato & Koyama 2018): logit = psi(phi(x)) +
        # <embed(y), phi(x)>, phi(x) D's features; one dot product per image: "does x look like class y?"
        if self.embed is not None:
            if y is None:
                raise ValueError("this discriminator is class-conditional: call it as D(x, y) with the classes y")
            logits = logits + (self.embed(y).to(features.dtype) * features.flatten(1)).sum(dim=1)
        return (logits, features) if with_features else logits


@torch.no_grad()
def dcgan_init_(module: nn.Module) -> None:
    """Convolution weights ~ N(0, 0.02) (the DCGAN paper, sec. 4); BatchNorm scale ~ N(1, 0.02) and
    shift 0, as pytorch/examples' weights_init does (the paper says nothing of them)."""
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


class MinibatchStd(nn.Module):
    """(N, C, H, W) -> (N, C + 1, H, W): the features' standard deviation across a group of g samples, averaged, as
    one more channel (ProGAN, Karras et al. 2018, sec. 3): a D that judges samples one at a time cannot see that a
    batch of fakes lacks variety. Groups as StyleGAN2-ADA's (sample n with n + N/g, ...; g shrinks to gcd(N, g)); in
    float32, as bf16 loses a small variance's digits."""

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
