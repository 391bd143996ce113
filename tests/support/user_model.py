"""A user's own models for ``--model tests.support.user_model:small_mlp`` (tests/library/test_loader_ranks.py)
and ``...:small_bn`` (tests/training/test_torch_engine.py)."""

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
