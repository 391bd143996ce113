"""Models for the GPU tests, named by ``--model tests.support.gpu_models:NAME`` (no pytest here: the
ranks import this module).

- :func:`memory_hungry` / :func:`memory_light`: one function in two sizes of memory. The image is
  tiled ``tile`` x ``tile`` times over 16 channels and passes 16 elementwise layers (scale, shift,
  tanh per channel), each keeping its output for the backward pass; the head reads the mean over
  the tiled image, which is the mean over one tile. So both compute the same logits and gradients
  from the same parameters (up to summation order), but ``memory_hungry`` keeps about 2 GiB per
  sample in float64 (a batch of 128 needs ~260 GiB: it cannot run whole on an H200) and
  ``memory_light`` a few hundred KiB (the whole batch in one pass).
- :func:`wide_conv`: little memory and few parameters (1.8 M: a cheap allreduce), much compute
  (three 3x3 convolutions of 256 channels at 28x28: ~2.8 GFLOP per sample forward), so that a
  rank's share of the GPU's multiprocessors decides its speed.
"""

import torch
import torch.nn as nn

CHANNELS, DEPTH = 16, 16
HUNGRY_TILE = 36  # 28 * 36 = 1008: 16 x 1008 x 1008 float64 = 130 MB per layer and sample


class Tiled(nn.Module):
    def __init__(self, tile: int, num_classes: int = 10):
        super().__init__()
        self.tile = tile
        gen = torch.Generator().manual_seed(3)  # the same parameters at any tile (and a non-trivial start)
        self.scale = nn.Parameter(1 + 0.3 * torch.randn(DEPTH, CHANNELS, 1, 1, generator=gen))
        self.shift = nn.Parameter(0.1 * torch.randn(DEPTH, CHANNELS, 1, 1, generator=gen))
        self.head = nn.Linear(CHANNELS, num_classes)

    def forward(self, images):
        x = images.repeat(1, CHANNELS // images.shape[1], self.tile, self.tile)
        for i in range(DEPTH):
            x = torch.tanh(x * self.scale[i] + self.shift[i])
        return self.head(x.mean(dim=(2, 3)))


def memory_hungry(num_classes=10):
    return Tiled(HUNGRY_TILE, num_classes)


def memory_light(num_classes=10):
    return Tiled(1, num_classes)


def wide_conv(num_classes=10, width=256):
    layers = [nn.Conv2d(1, width, 3, padding=1), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Conv2d(width, width, 3, padding=1), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes))
