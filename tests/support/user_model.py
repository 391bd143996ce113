"""A user's own models for ``--model tests.support.user_model:small_mlp`` (tests/library/test_loader_ranks.py),
``...:small_bn`` (tests/training/test_torch_engine.py) and ``...:small_dropout``
(tests/training/test_exact_paths.py)."""

from torch import nn


class SmallMLP(nn.Module):
    def __init__(self, num_classes: int):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, num_classes))

    def forward(self, x):
        return self.net(x)


def small_mlp(num_classes: int = 10) -> nn.Module:
    return SmallMLP(num_classes)


def not_a_module():
    return "a string"


def small_bn(num_classes: int = 10) -> nn.Module:
    """A small model with BatchNorm (``tests/training/test_torch_engine.py``: exact BatchNorm with the torch engine)."""
    layers = [nn.Flatten(), nn.Linear(28 * 28, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, num_classes)]
    return nn.Sequential(*layers)


def small_dropout(num_classes: int = 10) -> nn.Module:
    """A small model with a dropout module and a channel dropout (``tests/training/test_exact_paths.py``)."""
    layers = [nn.Conv2d(1, 4, 5), nn.Dropout2d(0.5), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 24 * 24, 32)]
    return nn.Sequential(*layers, nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, num_classes))
