"""Dropout drawn per global sample, so that N ranks train exactly as one process does.

A model's dropout draws its mask from the rank's random generator: with the global batch split
over 4 ranks, sample i meets a different mask than in one process holding the whole batch, and a
4-rank run no longer equals the 1-process run (training is as good, just not the same numbers).
:func:`exact_dropout` makes every dropout mask row a function of the sample alone: row i of the
j-th dropout call of a forward is drawn from a generator seeded by (seed, epoch, sample index, j),
whatever rank, split or micro-batch order the sample is in. The model's code stays as it is:
``nn.Dropout``, ``nn.Dropout1d/2d/3d``, ``F.dropout`` and ``F.dropout1d/2d/3d`` are intercepted
(a ``TorchFunctionMode`` that is active only inside the model's forward in training mode).

Usage::

    model = Net()                         # any nn.Module with dropout
    bno.exact_dropout(model, balancer)    # masks per (seed, epoch, sample, call)

Limits: every training forward must see the whole batch its loader delivered (the keys of its
rows) and alpha dropout is not covered, each refused with one line; activation checkpointing,
which re-runs a forward outside the model's hooks, draws other masks in that recomputation and is
not detected (docs/exactness.md). Cost: one small generator per sample and dropout call (a few
microseconds each).
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from bno_hvd.common.arguments import describe
from bno_hvd.common.errors import UsageError
from bno_hvd.library.loader import sample_seed

__all__ = ["exact_dropout", "SampleDropout"]

# dropout function -> number of feature dimensions a mask element covers (0: one mask per element)
_DROPOUTS = {F.dropout: None, F.dropout1d: 1, F.dropout2d: 2, F.dropout3d: 3}
_NOT_COVERED = (F.alpha_dropout, F.feature_alpha_dropout)
_SIGNATURES = {f: inspect.signature(f) for f in (*_DROPOUTS, *_NOT_COVERED)}


def dropout_seed(seed: int, epoch: int, index: int, call: int) -> int:
    """The seed of sample ``index``'s mask at the ``call``-th dropout of a forward, in ``epoch``
    (distinct from the sample's augmentation seed ``sample_seed(seed, epoch, index)``)."""
    return sample_seed(sample_seed(seed, epoch, index), call + 1, 0x5EED)


class SampleDropout(TorchFunctionMode):
    """Replaces dropout masks by per-sample ones while active. ``keys()`` gives the
    ``(epoch, index)`` of every row of the batch being processed."""

    def __init__(self, keys, seed: int):
        super().__init__()
        self.keys, self.seed, self.calls = keys, int(seed), 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DROPOUTS or func in _NOT_COVERED:
            bound = _SIGNATURES[func].bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            if not isinstance(a["p"], (int, float)) or not 0 <= a["p"] <= 1:  # torch's own rule
                raise UsageError(
                    f"{func.__name__}: dropout probability has to be between 0 and 1, got {describe(a['p'])}"
                )
            if a["training"] and a["p"] > 0:
                if func in _NOT_COVERED:
                    raise UsageError(f"exact_dropout covers dropout and dropout1d/2d/3d, not {func.__name__}")
                return self.drop(a["input"], float(a["p"]), _DROPOUTS[func], a["inplace"])
        return func(*args, **kwargs)

    def drop(self, x: torch.Tensor, p: float, feature_dims: int | None, inplace: bool) -> torch.Tensor:
        keys = self.keys()
        if x.dim() < 2 or x.shape[0] != len(keys):
            raise UsageError(
                f"exact_dropout: a training forward over {x.shape[0] if x.dim() else 0} rows, but the batch "
                f"the loader delivered has {len(keys)} samples; run the model on the whole batch"
            )
        if feature_dims is None:
            shape = tuple(x.shape[1:])
        else:
            shape = (x.shape[1],) + (1,) * (x.dim() - 2)  # one draw per channel, as Dropout2d does
        call, self.calls = self.calls, self.calls + 1
        rows = []
        for epoch, index in keys:
            g = torch.Generator().manual_seed(dropout_seed(self.seed, epoch, index, call))
            rows.append(torch.rand(shape, generator=g) >= p)  # kept with probability 1 - p
        keep = torch.stack(rows).to(device=x.device, dtype=x.dtype)
        scale = keep * (1.0 / (1.0 - p)) if p < 1 else keep
        return x.mul_(scale) if inplace else x * scale


def exact_dropout(model: torch.nn.Module, balancer) -> torch.nn.Module:
    """Make ``model``'s dropout masks per global sample; returns ``model``.

    Row i of the j-th dropout call of a training forward is drawn from (seed, epoch, sample
    index, j), whatever rank, split or micro-batch the sample is in; ``nn.Dropout``,
    ``nn.Dropout1d/2d/3d``, ``F.dropout`` and ``F.dropout1d/2d/3d`` are covered as the model
    calls them. Alpha dropout, and a training forward over part of the loader's batch, are
    refused in one line; activation checkpointing is not detected and draws other masks in its
    recomputation (docs/exactness.md).

    Args:
        model: the ``nn.Module``; hooks on its forward draw the masks while it trains.
        balancer: the :class:`~bno_hvd.Balancer` whose loader feeds the model (its seed, and
            the samples of the batch in progress).

    Example::

        model = bno.exact_dropout(Net(), train_sampler)   # Net's dropouts, drawn per sample
        for data, target in train_loader:                  # bno.DataLoader(..., sampler=train_sampler)
            loss = F.nll_loss(model(data), target)         # the whole batch in one forward
    """
    from bno_hvd.library.balancer import Balancer

    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"exact_dropout takes a torch.nn.Module, got {describe(model)}")
    if not isinstance(balancer, Balancer):
        raise UsageError(f"exact_dropout needs the Balancer that feeds the model, got {describe(balancer)}")

    def keys():
        step = balancer.current_step
        if step is None or not step.keys:
            raise UsageError(
                "exact_dropout: a training forward outside a batch of the balancer's loader "
                "(bno_hvd.DataLoader or balancer.loader)"
            )
        return step.keys

    mode = SampleDropout(keys, balancer.sampler.seed)

    entered = []  # per forward in progress: whether it entered the mode (training only: eval draws nothing)

    def enter(module, inputs):
        entered.append(module.training)
        if module.training:
            mode.calls = 0
            mode.__enter__()

    def leave(module, inputs, output):
        if entered.pop():
            mode.__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)
    return model
