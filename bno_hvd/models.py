"""Models for 1-channel 28x28 images (Fashion-MNIST, MNIST, synthetic) with 10 classes.

- ``cnn``: :class:`BaselineCNN`, small and deterministic (no dropout, no batch-norm), so multi-rank
  training can be compared exactly against one process training on the global batch.
- ``alexnet``, ``resnet50``, ``vgg16``: the unchanged torchvision architectures (``weights=None``,
  never a download), behind :class:`GrayscaleAdapter`. The adapter repeats the gray channel to the
  3 channels the stem expects (so parameter counts are torchvision's, apart from the 10-class head)
  and, only where the architecture cannot take 28x28, bilinearly resizes to the smallest side it
  accepts (found empirically, see ``tests/test_models.py``):

  ========  ==========  ==============================================================
  model     input side  why
  ========  ==========  ==============================================================
  alexnet   63          stride-4 stem and three 3x3/2 max-pools; 62 collapses to 0x0
  resnet50  33          at 28-32 layer4's maps are 1x1, so batch-norm fails on a 1-sample
                        batch (one value per channel) - and uneven allocations do give a rank
                        one sample; at 33 they are 2x2
  vgg16     32          five 2x2/2 max-pools; 28 collapses to 0x0 after the fifth
  ========  ==========  ==============================================================

Usage::

    model = build_model("resnet50")
    logits = model(images)  # images [N, 1, 28, 28] -> logits [N, 10]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from bno_hvd.errors import UsageError

from bno_hvd.catalog import MODEL_NAMES  # noqa: E402  (one definition, torch-free)

# Input side each torchvision model gets; None = feed 28x28 unchanged.
TORCHVISION_INPUT_SIDE = {"alexnet": 63, "resnet50": 33, "vgg16": 32}


class BaselineCNN(nn.Module):
    """Two conv-ReLU-max-pool blocks and two linear layers; input [N, 1, 28, 28], output logits [N, classes].

    Sized for CPU: 16 and 32 channels keep a step cheap enough for 4 ranks on 2 cores, and still
    reach >80% Fashion-MNIST test accuracy within a few hundred updates.
    """

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=5, padding=2)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # 28 -> 14
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # 14 -> 7
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


class GrayscaleAdapter(nn.Module):
    """Feed [N, 1, H, W] images to a 3-channel torchvision ``net``, resized to ``side`` if given."""

    def __init__(self, net: nn.Module, side: int | None):
        super().__init__()
        self.net = net
        self.side = side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.side is not None and x.shape[-1] != self.side:
            x = F.interpolate(x, size=(self.side, self.side), mode="bilinear", align_corners=False)
        # expand is a view of the gray channel; repeat would copy the batch three times.
        return self.net(x.expand(-1, 3, -1, -1))

    def extra_repr(self) -> str:
        return f"side={self.side}"


def build_model(name: str, num_classes: int = 10) -> nn.Module:
    """Build model ``name`` (one of :data:`MODEL_NAMES`) with random weights for 1x28x28 inputs.

    Returns an ``nn.Module`` mapping float images [N, 1, 28, 28] to logits [N, num_classes].
    Raises :class:`UsageError` for an unknown name or a non-positive ``num_classes``.
    """
    if name not in MODEL_NAMES:
        raise UsageError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    if num_classes < 1:
        raise UsageError(f"num_classes must be at least 1, got {num_classes}")
    if name == "cnn":
        return BaselineCNN(num_classes)
    # weights=None: random init and never a download (cluster nodes may be offline).
    net = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    return GrayscaleAdapter(net, TORCHVISION_INPUT_SIDE[name])
