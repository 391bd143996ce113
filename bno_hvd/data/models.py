"""Models: the baseline CNN, any torchvision classification model, or the user's own.

``--model`` takes

- ``cnn``: :class:`BaselineCNN`, small and deterministic (no dropout, no batch-norm), so multi-rank
  training can be compared exactly against one process training on the global batch;
- any torchvision classification model by name (``resnet18``, ``alexnet``, ``vgg16``, ...:
  ``torchvision.models.list_models(module=torchvision.models)``), with random weights (never a
  download);
- ``package.module:function``: the user's own; ``function(num_classes=N)`` (or ``function()`` if it
  takes no ``num_classes``) must return an ``nn.Module`` mapping the dataset's image batches to
  logits. It gets the images exactly as the dataset gives them.

Inputs (the built-in and torchvision models; :class:`InputAdapter`):

- channels: a 1-channel dataset (Fashion-MNIST) feeds the gray channel to all 3 inputs of a
  torchvision stem (a view, no copy, so parameter counts are torchvision's apart from the head);
  a 3-channel dataset feeds the CNN the mean of its channels;
- size: images go in at the dataset's size, unless the architecture cannot take it; then they are
  bilinearly resized to the smallest side it accepts, found by trying (a batch of one sample in
  training mode, because an uneven allocation can give a rank one sample and batch-norm needs more
  than one value per channel). For 28x28 images, measured (``tests/data/test_models.py``):

  ========  ==========  ==============================================================
  model     input side  why
  ========  ==========  ==============================================================
  alexnet   63          stride-4 stem and three 3x3/2 max-pools; 62 collapses to 0x0
  resnet50  33          at 28-32 layer4's maps are 1x1, so batch-norm fails on a 1-sample
                        batch; at 33 they are 2x2
  vgg16     32          five 2x2/2 max-pools; 28 collapses to 0x0 after the fifth
  ========  ==========  ==============================================================

Usage::

    model = build_model("resnet18", num_classes=10, input_shape=(1, 28, 28))
"""

from __future__ import annotations

import importlib
import inspect

import torch
import torch.nn.functional as F
from torch import nn

from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import clip, show_quoted, show_text
from bno_hvd.data.catalog import MODEL_NAMES

# Input side each built-in torchvision model needs for 28x28 images (what the probe finds).
TORCHVISION_INPUT_SIDE = {"alexnet": 63, "resnet50": 33, "vgg16": 32}
MNIST_SHAPE = (1, 28, 28)
MAX_SIDE = 512


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


class InputAdapter(nn.Module):
    """Feed [N, C, H, W] images to ``net``, which takes ``channels`` channels and (if ``side`` is
    set) square images of that side: see the module doc."""

    def __init__(self, net: nn.Module, side: int | None, channels: int = 3):
        super().__init__()
        self.net = net
        self.side = side
        self.channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.side is not None and (x.shape[-1] != self.side or x.shape[-2] != self.side):
            x = F.interpolate(x, size=(self.side, self.side), mode="bilinear", align_corners=False)
        if x.shape[1] != self.channels:
            # expand is a view of the gray channel; repeat would copy the batch three times
            x = x.expand(-1, self.channels, -1, -1) if x.shape[1] == 1 else x.mean(1, keepdim=True)
        return self.net(x)

    def extra_repr(self) -> str:
        return f"side={self.side}, channels={self.channels}"


def build_model(spec: str, num_classes: int = 10, input_shape: tuple[int, int, int] = MNIST_SHAPE) -> nn.Module:
    """The model ``spec`` names, with random weights, for images of ``input_shape`` (C, H, W): what
    ``bno-hvd train --model`` builds.

    Raises :class:`UsageError` for an unknown name, a ``module:function`` that does not import or
    does not return a Module, or a non-positive ``num_classes``.

    Args:
        spec: ``cnn`` (the baseline CNN), a torchvision classification model (``resnet18``, ...;
            inputs resized to what it needs) or ``package.module:function`` (called with
            ``num_classes=`` where it takes it).
        num_classes: the classifier's outputs.
        input_shape: ``(channels, height, width)`` of the images (Fashion-MNIST's by default).

    Example::

        model = bno.build_model("cnn")                               # Fashion-MNIST's 1x28x28
        model = bno.build_model("resnet18", num_classes=100, input_shape=(3, 32, 32))
    """
    if num_classes < 1:
        raise UsageError(f"num_classes must be at least 1, got {num_classes}")
    channels, height, width = input_shape
    if ":" in spec:
        return _user_model(spec, num_classes)
    if spec == "cnn":
        net = BaselineCNN(num_classes)
        return net if tuple(input_shape) == MNIST_SHAPE else InputAdapter(net, 28, channels=1)
    if spec not in torchvision_models():
        raise UsageError(
            f"--model {show_quoted(spec)} is not one of {', '.join(MODEL_NAMES)}, a torchvision classification "
            "model (e.g. resnet18) or package.module:function"
        )
    net = _torchvision(spec, num_classes)
    if spec in TORCHVISION_INPUT_SIDE and tuple(input_shape) == MNIST_SHAPE:
        side = TORCHVISION_INPUT_SIDE[spec]
    else:
        side = smallest_side(lambda: _torchvision(spec, num_classes), max(height, width), spec)
    return InputAdapter(net, side if side != height or height != width else None, channels=3)


def torchvision_models() -> list[str]:
    import torchvision  # here, not at the top: its import costs as much CPU as torch's, in every rank

    return torchvision.models.list_models(module=torchvision.models)


def smallest_side(make, side: int, name: str) -> int:
    """The smallest square side >= ``side`` on which a fresh ``make()`` runs a 1-sample training batch."""
    probe = make().train()

    def works(s: int) -> bool:
        try:
            with torch.no_grad():
                probe(torch.zeros(1, 3, s, s))
            return True
        except (RuntimeError, ValueError, AssertionError):
            return False

    if works(side):
        return side
    bad, good = side, None
    s = side
    while s < MAX_SIDE:
        s = min(MAX_SIDE, 2 * s)
        if works(s):
            good = s
            break
        bad = s
    if good is None:
        raise UsageError(
            f"--model {name} does not run on images of side {side} to {MAX_SIDE}; "
            "use --image-size (imagefolder) or another model"
        )
    while good - bad > 1:  # bisection; keep the doubling result if the sizes that work are not contiguous
        mid = (bad + good) // 2
        if works(mid):
            good = mid
        else:
            bad = mid
    return good


def _torchvision(name: str, num_classes: int) -> nn.Module:
    import torchvision

    builder = torchvision.models.get_model_builder(name)
    extra = {"aux_logits": False} if "aux_logits" in inspect.signature(builder).parameters else {}
    if name == "inception_v3":
        extra["init_weights"] = True
    return builder(weights=None, num_classes=num_classes, **extra)


def load_user_function(spec: str):
    """``package.module:function`` imported: ``(function, spec as shown in messages)``; :class:`UsageError` if not."""
    module_name, _, attr = spec.partition(":")
    shown = show_text(spec)  # a spec may hold anything a shell can pass, line breaks included
    if not module_name or not attr or not module_name.replace(".", "").replace("_", "").isalnum():
        raise UsageError(f"--model {shown}: write package.module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - an import can fail in any way
        raise UsageError(
            f"--model {shown}: cannot import {module_name} ({type(err).__name__}: "
            f"{clip(str(err), 200)}); is it on PYTHONPATH?"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UsageError(f"--model {shown}: {module_name} has no function {show_text(attr)}")
    return fn, shown


def _user_model(spec: str, num_classes: int) -> nn.Module:
    fn, shown = load_user_function(spec)
    try:
        takes_classes = "num_classes" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_classes = False
    try:
        net = fn(num_classes=num_classes) if takes_classes else fn()
    except Exception as err:  # noqa: BLE001
        raise UsageError(f"--model {shown}: calling it failed ({type(err).__name__}: {clip(str(err), 200)})") from None
    if not isinstance(net, nn.Module):
        raise UsageError(f"--model {shown} returned {type(net).__name__}, not a torch.nn.Module")
    return net
