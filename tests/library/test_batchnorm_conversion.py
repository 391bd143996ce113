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


@pytest.mark.parametrize(
    "kind, shape, affine, momentum",
    [
        (nn.BatchNorm1d, (9, 4), True, 0.1),
        (nn.BatchNorm1d, (6, 3, 10), False, None),
        (nn.BatchNorm2d, (7, 5, 6, 6), True, 0.1),
        (nn.BatchNorm3d, (3, 2, 4, 3, 5), True, None),
    ],
)
def test_one_process_normalises_and_differentiates_as_torchs_batchnorm(kind, shape, affine, momentum):
    """The layer's arithmetic (torch's kernels around its two reductions), in float64 and one process,
    whose reductions add nothing: output, input, weight and bias gradients and running statistics
    are torch's own BatchNorm's; the frame (a rank's gradient weight, here 0.25) cancels."""
    from bno_hvd.library.batchnorm import UpdateContext, _GlobalNorm

    torch.manual_seed(0)
    ref = kind(shape[1], affine=affine, momentum=momentum).double()
    if affine:
        with torch.no_grad():
            ref.weight.normal_()
            ref.bias.normal_()
    x = (torch.randn(shape, dtype=torch.float64) * 3 + 2).requires_grad_()
    dy = torch.randn(shape, dtype=torch.float64)
    running = (ref.running_mean.clone(), ref.running_var.clone())
    reduced = []
    context = UpdateContext(lambda tensor, name: reduced.append(name), 0.25, 0)
    ours = x.detach().clone().requires_grad_()
    factor = 1.0 if momentum is None else momentum  # the first update: a cumulative average of one
    y = _GlobalNorm.apply(ours, ref.weight, ref.bias, *running, factor, ref.eps, context, "layer")
    grads = torch.autograd.grad(y, [ours] + ([ref.weight, ref.bias] if affine else []), dy)
    y_ref = ref(x)
    grads_ref = torch.autograd.grad(y_ref, [x] + ([ref.weight, ref.bias] if affine else []), dy)
    assert reduced == ["bno.bn.layer.stats", "bno.bn.layer.grads"]
    for a, b in [(y, y_ref), *zip(grads, grads_ref), (running[0], ref.running_mean), (running[1], ref.running_var)]:
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12), (a - b).abs().max()
