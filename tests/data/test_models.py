"""Models: shapes, finite gradients, the exact structure of BaselineCNN, adapter input sizes."""

import pytest
import torch
import torchvision
from torch import nn

from bno_hvd.common.errors import UsageError
from bno_hvd.data.models import MODEL_NAMES, TORCHVISION_INPUT_SIDE, BaselineCNN, InputAdapter, build_model

torch.set_num_threads(1)

# The torchvision models are heavy on CPU; batch 2 keeps the whole file to seconds
# (batch-norm in training mode needs more than one sample per channel, so not 1).
BATCH = {"cnn": 4, "alexnet": 4, "resnet50": 2, "vgg16": 2}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_forward_backward_gives_logits_and_finite_grads(name):
    torch.manual_seed(0)
    model = build_model(name).train()
    images = torch.randn(BATCH[name], 1, 28, 28)
    logits = model(images)
    assert logits.shape == (BATCH[name], 10)
    nn.functional.cross_entropy(logits, torch.arange(BATCH[name]) % 10).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_num_classes_sets_the_head():
    assert build_model("cnn", num_classes=3)(torch.zeros(2, 1, 28, 28)).shape == (2, 3)
    assert build_model("alexnet", num_classes=3)(torch.zeros(2, 1, 28, 28)).shape == (2, 3)


def test_baseline_cnn_structure_is_exact():
    model = build_model("cnn")
    assert isinstance(model, BaselineCNN)
    kinds = [type(m) for m in model.modules()]
    assert kinds.count(nn.Conv2d) == 2 and kinds.count(nn.Linear) == 2
    forbidden = (nn.Dropout, nn.Dropout2d, nn.modules.batchnorm._BatchNorm)
    assert not any(isinstance(m, forbidden) for m in model.modules())
    assert sum(p.numel() for p in model.parameters()) == 215_370


def test_baseline_cnn_is_deterministic_in_train_mode():
    # No dropout or batch statistics: train and eval mode compute the same function.
    model = build_model("cnn")
    images = torch.randn(3, 1, 28, 28)
    train_out = model.train()(images)
    assert torch.equal(train_out, model.eval()(images))


@pytest.mark.parametrize("name", ["alexnet", "vgg16"])
def test_adapter_side_is_the_smallest_the_architecture_accepts(name):
    side = TORCHVISION_INPUT_SIDE[name]
    net = getattr(torchvision.models, name)(weights=None, num_classes=10).eval()
    with torch.no_grad():
        assert net(torch.zeros(1, 3, side, side)).shape == (1, 10)
        with pytest.raises(RuntimeError):
            net(torch.zeros(1, 3, side - 1, side - 1))


def test_resnet50_trains_on_a_one_sample_batch():
    # an uneven allocation can give a rank one sample; batch-norm needs > 1 value per channel
    model = build_model("resnet50")
    assert isinstance(model, InputAdapter) and model.side == 33
    assert isinstance(model.net, torchvision.models.ResNet)
    out = model.train()(torch.zeros(1, 1, 28, 28))
    out.sum().backward()
    assert out.shape == (1, 10)


def test_adapter_feeds_the_gray_channel_to_all_three_inputs():
    seen = []
    stem = nn.Conv2d(3, 1, 1)
    stem.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    adapter = InputAdapter(nn.Sequential(stem, nn.Flatten()), side=32)
    images = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    adapter(images)
    assert seen[0].shape == (2, 3, 32, 32)
    assert torch.equal(seen[0][:, 0], seen[0][:, 2])
    assert seen[0].mean().item() == pytest.approx(images.mean().item(), abs=0.01)


def test_unknown_model_lists_the_choices():
    with pytest.raises(UsageError) as err:
        build_model("resnet18x")
    assert all(name in str(err.value) for name in MODEL_NAMES)


@pytest.mark.slow
def test_a_rank_imports_torchvision_only_for_a_torchvision_model():
    # torchvision's import costs as much CPU as torch's, in every rank of every job; one fresh
    # interpreter builds the CNN (no torchvision yet), then resnet18 (now torchvision)
    import subprocess
    import sys

    from support.jobs import ROOT, mpi_env

    check = "import sys, bno_hvd.training.components; from bno_hvd.data.models import build_model; "
    check += "build_model('cnn'); cnn = 'torchvision' in sys.modules; build_model('resnet18'); "
    check += "print(cnn, 'torchvision' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=mpi_env(), cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "False True", proc.stderr[-2000:]
