"""What ``exact_batchnorm`` converts and what it says (no process, no forward through Horovod):
every BatchNorm layer becomes a GlobalBatchNorm holding the very same tensors under the same keys;
layers that use batch statistics and stay as they are get one ``bno-hvd: note:``; a training
forward outside a batch of the balancer's loader is refused in one line."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from bno_hvd import UsageError, exact_batchnorm
from bno_hvd.data.models import build_model
from bno_hvd.library.batchnorm import GlobalBatchNorm, inexact_norms


class ThirdPartyNorm(nn.Module):
    def forward(self, x):
        return (x - x.mean(0)) / (x.std(0) + 1e-5)


def balancer(rank=0):
    """What the conversion reads of a Balancer: its rank and the step in progress (none here)."""
    return SimpleNamespace(rank=rank, current_step=None)


def test_resnet18_is_converted_with_the_same_tensors_and_keys(capsys):
    model = build_model("resnet18", 10, (1, 28, 28))
    before = {k: v for k, v in model.state_dict(keep_vars=True).items()}
    kinds = [type(m) for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    exact_batchnorm(model, balancer())
    after = model.state_dict(keep_vars=True)
    assert len(kinds) == 20 and sum(isinstance(m, GlobalBatchNorm) for m in model.modules()) == 20
    assert not any(type(m) is nn.BatchNorm2d for m in model.modules())
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert capsys.readouterr().err == ""  # nothing inexact left
    model.eval()
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)  # eval: running statistics, no communication
    model.train()
    with pytest.raises(UsageError, match="outside a batch of the balancer's loader"):
        model(torch.zeros(2, 1, 28, 28))


def test_one_note_names_the_layers_that_stay_per_rank(capsys):
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.BatchNorm2d(4),
        nn.GroupNorm(2, 4),  # per sample: exact as it is
        nn.InstanceNorm2d(4, track_running_stats=True),
        nn.InstanceNorm2d(4),  # no running statistics: per sample
        nn.Flatten(),
        nn.LayerNorm(4 * 26 * 26),
        ThirdPartyNorm(),
    )
    exact_batchnorm(model, balancer())
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bno-hvd: note: "), lines
    assert "3 (InstanceNorm2d with running statistics)" in lines[0] and "7 (ThirdPartyNorm)" in lines[0]
    assert "GroupNorm" not in lines[0] and "LayerNorm" not in lines[0] and "4 (" not in lines[0]
    assert isinstance(model[1], GlobalBatchNorm) and inexact_norms(model) == [
        "3 (InstanceNorm2d with running statistics)",
        "7 (ThirdPartyNorm)",
    ]
    exact_batchnorm(model, balancer(rank=1))  # only rank 0 says it
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("layer", [nn.BatchNorm1d(3, affine=False, momentum=None), nn.BatchNorm3d(3)])
def test_options_and_input_checks_are_the_layers(layer):
    model = nn.Sequential(nn.Identity(), layer)
    exact_batchnorm(model, balancer())
    new = model[1]
    assert (new.affine, new.momentum, new.eps, new.track_running_stats) == (
        layer.affine,
        layer.momentum,
        layer.eps,
        layer.track_running_stats,
    )
    model.eval()
    with pytest.raises(ValueError, match="expected"):
        model(torch.zeros(2, 3, 4, 4))  # 4D fits neither BatchNorm1d nor BatchNorm3d


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_batchnorm_under_activation_checkpointing_is_refused_in_one_line(reentrant):
    from torch.utils.checkpoint import checkpoint

    model = exact_batchnorm(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)), balancer())
    x = torch.randn(5, 3, requires_grad=True)
    with pytest.raises(UsageError, match="outside a batch of the balancer's loader"):
        model(x)  # not checkpointed: the layer gets as far as asking for the update in progress
    with pytest.raises(UsageError, match=r"^exact_batchnorm: BatchNorm1d '0' under activation checkpointing") as err:
        checkpoint(model, x, use_reentrant=reentrant).sum().backward()
    assert "\n" not in str(err.value)
    assert int(model[1].num_batches_tracked) == 0  # refused before it touched the running statistics
