"""How exact_dropout reaches a model's dropout calls, in this process (a one-rank Balancer on
MPI.COMM_SELF): torch.nn.functional's dropout functions are routed to the model's SampleDropout
during its training forwards only, and draw what the mode draws; torch's own functions are back
after every forward (also one that raised) and in every other thread; a dropout called by
another name is refused in one line at the first training forward, and so is a dropout under
activation checkpointing (both of torch.utils.checkpoint's kinds)."""

import threading

import pytest
import torch
import torch.nn.functional as F

import bno_hvd as bno
from bno_hvd.common.errors import UsageError
from bno_hvd.library.dropout import ROUTING, SampleDropout

TORCH_DROPOUT = F.dropout
dropout_by_name = F.dropout  # the model below calls this name: torch's function, not the routed one


class Net(torch.nn.Module):
    def __init__(self, by_name=False, fail=False):
        super().__init__()
        self.drop2d, self.by_name, self.fail = torch.nn.Dropout2d(0.4), by_name, fail
        self.seen = []  # what F.dropout was during each forward

    def forward(self, x):
        self.seen.append(F.dropout)
        x = self.drop2d(x)
        if self.fail:
            raise ValueError("the model's own error")
        drop = dropout_by_name if self.by_name else F.dropout
        return drop(x.flatten(1), p=0.3, training=self.training)


@pytest.fixture(scope="module")
def balancer():
    from mpi4py import MPI

    bal = bno.Balancer(MPI.COMM_SELF, bno.make_strategy("equal", 1, 6), 60, seed=3)
    batches = iter(bal.loader(list(range(60)), seed_samples=False))
    bal.start_step(next(batches))  # the forwards below run in this batch: its 6 samples are the rows
    return bal


def test_routed_calls_draw_what_the_mode_draws_and_torch_is_back_after(balancer):
    x = torch.randn(6, 3, 4, 4, dtype=torch.float64)
    model = bno.exact_dropout(Net(), balancer)
    checking, routed = model(x), model(x)  # the first training forward also runs under the mode
    with SampleDropout(lambda: balancer.current_step.keys, balancer.sampler.seed):
        expected = Net.forward(model, x)
    assert torch.equal(checking, expected) and torch.equal(routed, expected)
    assert model.seen[0] is not TORCH_DROPOUT and model.seen[1] is not TORCH_DROPOUT
    assert F.dropout is TORCH_DROPOUT
    model.eval()
    assert torch.equal(model(x), x.flatten(1)) and model.seen[-1] is TORCH_DROPOUT  # eval: nothing routed


def test_torch_is_back_after_a_forward_that_raised(balancer):
    model = bno.exact_dropout(Net(fail=True), balancer)
    with pytest.raises(ValueError, match="the model's own error"):
        model(torch.randn(6, 3, 4, 4))
    assert F.dropout is TORCH_DROPOUT and ROUTING.users == 0


def test_a_dropout_called_by_another_name_is_refused_at_the_first_training_forward(balancer):
    model = bno.exact_dropout(Net(by_name=True), balancer)
    with pytest.raises(UsageError, match=r"calls dropout by another name than torch.nn.functional.dropout .*F.dropout"):
        model(torch.randn(6, 3, 4, 4))
    assert F.dropout is TORCH_DROPOUT


def test_another_thread_meets_torchs_own_dropout_while_a_model_trains():
    mode = SampleDropout(lambda: [(0, i) for i in range(4)], 0)
    drawn = []
    ROUTING.enter(mode)
    try:
        assert F.dropout is not TORCH_DROPOUT
        worker = threading.Thread(target=lambda: drawn.append(F.dropout(torch.ones(4, 8), 0.5, True)))
        worker.start()
        worker.join()
        assert mode.calls == 0 and drawn[0].shape == (4, 8)  # torch's own draw, not the mode's
        F.dropout(torch.ones(4, 8), 0.5, True)
        assert mode.calls == 1
    finally:
        ROUTING.leave()
    assert F.dropout is TORCH_DROPOUT


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_dropout_under_activation_checkpointing_is_refused_in_one_line(balancer, reentrant):
    model = bno.exact_dropout(Net(), balancer)
    x = torch.randn(6, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    model(x).sum().backward()  # outside checkpointing: exact masks
    inner = torch.nn.Sequential(torch.nn.Linear(48, 48), torch.nn.Dropout(0.5)).double()
    outer = bno.exact_dropout(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Identity()), balancer)
    outer[1] = CheckpointedPart(inner, reentrant)
    with pytest.raises(UsageError, match=r"^exact_dropout: a dropout under activation checkpointing") as err:
        outer(x).sum().backward()
    assert "\n" not in str(err.value) and F.dropout is TORCH_DROPOUT
    model(x).sum().backward()  # the refusal left nothing behind


class CheckpointedPart(torch.nn.Module):
    def __init__(self, part, reentrant):
        super().__init__()
        self.part, self.reentrant = part, reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.part, x, use_reentrant=self.reentrant)
