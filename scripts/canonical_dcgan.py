"""The canonical DCGAN: pytorch/examples' dcgan/main.py, rewritten faithfully as the baseline that
scripts/compare.py races this project against (and whose iteration scripts/bench.py times).

Every choice below is main.py's, with its command-line default, and each is commented where it is
made. What differs from main.py, and why:
- image sizes: main.py's networks are written out for 64 px only; here the same pattern (a 4x4
  projection, stride-2 blocks that halve the width, Tanh; D its mirror image ending in a 4x4
  convolution and a Sigmoid) is built for any power of two from 16 px, so a 32 px run drops one
  block from each network. At 64 px the layer lists are main.py's exactly (tests/test_compare.py
  counts 3,576,704 parameters in G and 2,765,568 in D for RGB, as main.py prints them).
- data: images come as a uint8 tensor that this project has already resized, and the Dataset below
  applies main.py's per-image transform (ToTensor's /255, then Normalize((0.5,), (0.5,))) in the
  DataLoader's workers, as torchvision's datasets do.
- length: a wall-clock budget instead of `--niter` epochs (`after_step` says when to stop), and
  the per-iteration print goes to the debug log.
- the seed: main.py draws a random one unless --manualSeed is given; here it is given.
This is a program, not part of the library: nothing under gan/ imports it.
"""

from __future__ import annotations

import itertools
import logging
import math
from pathlib import Path
from typing import Callable, Optional

import torch
import torchvision.utils as vutils
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

log = logging.getLogger(__name__)

# main.py's command-line defaults
NZ, NGF, NDF = 100, 64, 64  # --nz (latent size), --ngf and --ndf (widths at full resolution)
BATCH_SIZE = 64  # --batchSize
LR, BETA1 = 0.0002, 0.5  # --lr, --beta1 (Adam's beta2 stays 0.999)
WORKERS = 2  # --workers: data-loading processes
SAMPLE_EVERY = 100  # `if i % 100 == 0`: save the real batch and the fixed-noise fakes


def blocks_for(image_size: int) -> int:
    """Stride-2 blocks between the 4x4 layer and the last one: 3 at main.py's 64 px."""
    if image_size < 16 or 2 ** int(math.log2(image_size)) != image_size:
        raise ValueError(f"the canonical DCGAN builds powers of two from 16 px, not {image_size}")
    return int(math.log2(image_size)) - 3


class Generator(nn.Module):
    """main.py's netG: z (N, nz, 1, 1) -> 4x4 -> ... -> (N, nc, size, size) in [-1, 1]."""

    def __init__(self, nz: int, ngf: int, nc: int, image_size: int):
        super().__init__()
        mult = 2 ** blocks_for(image_size)  # ngf * 8 at 4x4 for 64 px
        layers: list[nn.Module] = [
            nn.ConvTranspose2d(nz, ngf * mult, 4, 1, 0, bias=False),  # no bias: BatchNorm's shift replaces it
            nn.BatchNorm2d(ngf * mult),
            nn.ReLU(True),
        ]
        while mult > 1:
            layers += [nn.ConvTranspose2d(ngf * mult, ngf * mult // 2, 4, 2, 1, bias=False)]
            layers += [nn.BatchNorm2d(ngf * mult // 2), nn.ReLU(True)]
            mult //= 2
        layers += [nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh()]  # pixels in [-1, 1], as the data
        self.main = nn.Sequential(*layers)

    def forward(self, input: Tensor) -> Tensor:
        return self.main(input)


class Discriminator(nn.Module):
    """main.py's netD: image -> the probability that it is real, ending in nn.Sigmoid."""

    def __init__(self, ndf: int, nc: int, image_size: int):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
        mult = 1  # no BatchNorm on the input layer (DCGAN paper: it made training unstable)
        for _ in range(blocks_for(image_size)):
            layers += [nn.Conv2d(ndf * mult, ndf * mult * 2, 4, 2, 1, bias=False)]
            layers += [nn.BatchNorm2d(ndf * mult * 2), nn.LeakyReLU(0.2, inplace=True)]
            mult *= 2
        layers += [nn.Conv2d(ndf * mult, 1, 4, 1, 0, bias=False), nn.Sigmoid()]  # BCELoss takes probabilities
        self.main = nn.Sequential(*layers)

    def forward(self, input: Tensor) -> Tensor:
        return self.main(input).view(-1, 1).squeeze(1)


def weights_init(m: nn.Module) -> None:
    """main.py's initialisation (DCGAN paper): convolutions N(0, 0.02); BatchNorm scale N(1, 0.02), shift 0."""
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


class Images(Dataset):
    """uint8 (N, C, H, W) images with labels, transformed one at a time as torchvision's datasets do:
    ToTensor (to [0, 1]) then Normalize((0.5,), (0.5,)) (to [-1, 1])."""

    def __init__(self, images: Tensor, labels: Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return self.images.size(0)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.images[index].float().div(255).sub(0.5).div(0.5), self.labels[index]


def iteration(
    netG: nn.Module,
    netD: nn.Module,
    criterion: nn.Module,
    optimizerD: torch.optim.Optimizer,
    optimizerG: torch.optim.Optimizer,
    real: Tensor,
    noise: Tensor,
) -> tuple[Tensor, Tensor, float, float, float]:
    """One iteration of main.py's loop body: errD, errG, and D(x), D(G(z)) before and after D's update."""
    real_label, fake_label = 1.0, 0.0
    ############################
    # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
    ###########################
    # train with real
    netD.zero_grad()  # main.py's zeroing (modern torch sets the grads to None here)
    label = torch.full((real.size(0),), real_label, dtype=real.dtype, device=real.device)
    output = netD(real)
    errD_real = criterion(output, label)
    errD_real.backward()
    D_x = output.mean().item()  # .item(): main.py prints these every iteration (a sync on a GPU)
    # train with fake
    fake = netG(noise)
    label.fill_(fake_label)
    output = netD(fake.detach())  # detach: D's loss must not reach G's weights
    errD_fake = criterion(output, label)
    errD_fake.backward()
    D_G_z1 = output.mean().item()
    errD = errD_real + errD_fake
    optimizerD.step()
    ############################
    # (2) Update G network: maximize log(D(G(z)))
    ###########################
    netG.zero_grad()
    label.fill_(real_label)  # fake labels are real for generator cost (the non-saturating loss)
    output = netD(fake)  # D is not frozen: its gradients are computed and cleared by the next zero_grad
    errG = criterion(output, label)
    errG.backward()
    D_G_z2 = output.mean().item()
    optimizerG.step()
    return errD, errG, D_x, D_G_z1, D_G_z2


def train(
    images: Tensor,
    labels: Tensor,
    out: Path,
    after_step: Callable[[nn.Module, int], bool],
    seed: int = 0,
    device: str = "cpu",
    nz: int = NZ,
    ngf: int = NGF,
    ndf: int = NDF,
    batch_size: int = BATCH_SIZE,
    workers: int = WORKERS,
) -> tuple[Generator, int]:
    """main.py's training on `images` until `after_step(netG, iterations)` returns True; writes
    main.py's files into `out` (real_samples.png, fake_samples_epoch_NNN.png, netG/netD_epoch_N.pth).
    Returns G and the number of iterations."""
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)  # --manualSeed
    nc, image_size = images.size(1), images.size(-1)
    dataloader = DataLoader(Images(images, labels), batch_size=batch_size, shuffle=True, num_workers=workers)
    netG = Generator(nz, ngf, nc, image_size).to(device)
    netG.apply(weights_init)
    netD = Discriminator(ndf, nc, image_size).to(device)
    netD.apply(weights_init)
    criterion = nn.BCELoss()
    fixed_noise = torch.randn(batch_size, nz, 1, 1, device=device)
    optimizerD = torch.optim.Adam(netD.parameters(), lr=LR, betas=(BETA1, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=LR, betas=(BETA1, 0.999))
    done = 0
    for epoch in itertools.count():
        for i, data in enumerate(dataloader, 0):
            real_cpu = data[0].to(device)
            noise = torch.randn(real_cpu.size(0), nz, 1, 1, device=device)
            errD, errG, D_x, D_G_z1, D_G_z2 = iteration(netG, netD, criterion, optimizerD, optimizerG, real_cpu, noise)
            log.debug("[%d][%d/%d] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f",
                      epoch, i, len(dataloader), errD.item(), errG.item(), D_x, D_G_z1, D_G_z2)  # fmt: skip
            if i % SAMPLE_EVERY == 0:
                vutils.save_image(real_cpu, out / "real_samples.png", normalize=True)
                fake = netG(fixed_noise)  # main.py samples in training mode, BatchNorm on this batch
                vutils.save_image(fake.detach(), out / f"fake_samples_epoch_{epoch:03d}.png", normalize=True)
            done += 1
            if after_step(netG, done):
                return netG, done
        # do checkpointing (main.py: once per epoch)
        torch.save(netG.state_dict(), out / f"netG_epoch_{epoch}.pth")
        torch.save(netD.state_dict(), out / f"netD_epoch_{epoch}.pth")
    raise AssertionError("unreachable")


class Sampler(nn.Module):
    """A canonical netG behind this project's sampling interface (`z_dim`, `num_classes`, G(z) with
    z of shape (N, nz)), for evaluate.py's metrics. `batch_statistics=True` draws samples as main.py
    makes its PNGs: netG in training mode, so each batch of `batch` samples is normalised by its own
    BatchNorm statistics, whatever mode the caller set; False uses the running statistics (eval)."""

    def __init__(self, netG: Generator, nz: int, batch_statistics: bool = True, batch: int = BATCH_SIZE):
        super().__init__()
        self.netG, self.z_dim, self.num_classes = netG, nz, 0
        self.batch_statistics, self.batch = batch_statistics, batch

    def forward(self, z: Tensor, y: Optional[Tensor] = None) -> Tensor:
        self.netG.train(self.batch_statistics)  # updates the running statistics of this copy alone
        return torch.cat([self.netG(chunk.view(-1, self.z_dim, 1, 1)) for chunk in z.split(self.batch)])
