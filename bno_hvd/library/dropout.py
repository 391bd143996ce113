"""Dropout drawn per global sample, so that N ranks train exactly as one process does.

A model's dropout draws its mask from the rank's random generator: with the global batch split
over 4 ranks, sample i meets a different mask than in one process holding the whole batch, and a
4-rank run no longer equals the 1-process run (training is as good, just not the same numbers).
:func:`exact_dropout` makes every dropout mask row a function of the sample alone: element e of
row i at the j-th dropout call of a forward is a hash of (seed, epoch, sample index, j, e)
(:mod:`.dropmask`: counter-based, the whole batch in a few integer operations), whatever rank,
split, micro-batch order or device the sample is in. The model's code stays as it is:
``nn.Dropout``, ``nn.Dropout1d/2d/3d``, ``F.dropout`` and ``F.dropout1d/2d/3d`` are routed to
it while the model's forward trains (:class:`Routing`); the first training forward also runs
under a ``TorchFunctionMode`` (:class:`SampleDropout`), which sees a dropout function called by
another name than ``torch.nn.functional``'s, one routing would miss, and refuses it.

Usage::

    model = Net()                         # any nn.Module with dropout
    bno.exact_dropout(model, balancer)    # masks per (seed, epoch, sample, call)

Limits: every training forward must see the whole batch its loader delivered (the keys of its
rows); alpha dropout is not covered; activation checkpointing (``torch.utils.checkpoint``, which
re-runs a forward in the backward, outside the model's hooks, where other masks would be drawn)
around a dropout call; each is refused with one line (:func:`refuse_checkpointing`). A dropout
called by another name in a later forward only (not the first) is not detected (docs/exactness.md).
Cost: forward + backward of the example's Net (batch 32, float32, one thread) takes 1.07x its time
with torch's own dropout (alone, 2026-12-01), measured by
``benchmarks/dropout_cost.py --rounds 2000`` (docs/exactness.md#cost-of-exact-dropout).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch.overrides import TorchFunctionMode

from bno_hvd.common.arguments import describe
from bno_hvd.common.errors import UsageError
from bno_hvd.library.dropmask import call_terms, row_terms, sample_seeds, scaled_mask

__all__ = ["exact_dropout", "SampleDropout"]

# dropout function -> number of feature dimensions a mask element covers (None: one mask per element)
_DROPOUTS = {F.dropout: None, F.dropout1d: 1, F.dropout2d: 2, F.dropout3d: 3}
_NOT_COVERED = (F.alpha_dropout, F.feature_alpha_dropout)
_SIGNATURES = {f: inspect.signature(f) for f in (*_DROPOUTS, *_NOT_COVERED)}
_PARAMS = ("input", "p", "training", "inplace")  # what each of them takes, in this order
_UNROUTED = {}  # Routing's function -> torch's
_DEFAULTS = {  # of those whose signature is _PARAMS (all six in torch 2.13); bind reads the others
    f: {k: v.default for k, v in s.parameters.items()} for f, s in _SIGNATURES.items() if tuple(s.parameters) == _PARAMS
}


_CHECKPOINT = torch.utils.checkpoint.__file__  # both of its kinds (reentrant or not) run their forward from here


def refuse_checkpointing(what: str) -> None:
    """Refuse, in one line, a forward of ``what`` under activation checkpointing: the
    checkpointed part runs again in the backward, outside the model's forward, where neither the
    per-sample masks nor the global batch's statistics of that update are at hand (a frame of
    ``torch.utils.checkpoint`` in the stack; a few microseconds a call)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == _CHECKPOINT:
            raise UsageError(
                f"{what} under activation checkpointing (torch.utils.checkpoint), whose recomputation in the "
                "backward would not be exact: leave the dropout and BatchNorm layers outside the checkpointed parts"
            )
        frame = frame.f_back


def _arguments(func, args, kwargs) -> dict:
    """A dropout call's arguments by name, defaults filled in. inspect's bind (10-20 us a call)
    only for a call the quick path cannot read; it raises the TypeError torch would."""
    if func in _DEFAULTS and len(args) <= len(_PARAMS) and not kwargs.keys() - set(_PARAMS[len(args) :]):
        return {**_DEFAULTS[func], **dict(zip(_PARAMS, args)), **kwargs}
    bound = _SIGNATURES[func].bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


class SampleDropout(TorchFunctionMode):
    """Replaces dropout masks by per-sample ones: those of every dropout function called while
    active as a mode (``with``), and of the calls given to :meth:`handle`. ``keys()`` gives the
    ``(epoch, index)`` of every row of the batch being processed. With ``routed_only``, a draw
    that reaches the mode is refused: only a call by another name than ``torch.nn.functional``'s
    does, where ``exact_dropout`` routes (:class:`Routing`)."""

    def __init__(self, keys, seed: int):
        super().__init__()
        self.keys, self.seed, self.calls, self.routed_only = keys, int(seed), 0, False
        self._keys, self._terms = None, None  # the last batch's keys and its samples' row_terms

    def __torch_function__(self, func, types, args=(), kwargs=None):
        func = _UNROUTED.get(func, func)  # called by another name, torch's function reaches here as F's
        if func not in _SIGNATURES:  # every other function of the forward, as fast as a mode can
            return func(*args, **kwargs) if kwargs else func(*args)
        return self.handle(func, args, kwargs or {}, routed=False)

    def handle(self, func, args: tuple, kwargs: dict, routed: bool = True):
        """``func(*args, **kwargs)`` for torch's dropout function ``func``, its mask per sample."""
        a = _arguments(func, args, kwargs)
        if not isinstance(a["p"], (int, float)) or not 0 <= a["p"] <= 1:  # torch's own rule
            raise UsageError(f"{func.__name__}: dropout probability has to be between 0 and 1, got {describe(a['p'])}")
        if a["training"] and a["p"] > 0:
            if func in _NOT_COVERED:
                raise UsageError(f"exact_dropout covers dropout and dropout1d/2d/3d, not {func.__name__}")
            if self.routed_only and not routed:
                name = func.__name__
                raise UsageError(
                    f"exact_dropout: the model calls {name} by another name than torch.nn.functional.{name} "
                    f"(from torch.nn.functional import {name}?), which it cannot follow: call F.{name}"
                )
            return self.drop(a["input"], float(a["p"]), _DROPOUTS[func], a["inplace"])
        return func(*args, **kwargs)

    def drop(self, x: torch.Tensor, p: float, feature_dims: int | None, inplace: bool) -> torch.Tensor:
        refuse_checkpointing("exact_dropout: a dropout")
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
        if keys != self._keys:  # once per batch: each sample's terms
            self._keys, self._terms = tuple(keys), row_terms(sample_seeds(self.seed, keys))
        terms = self._terms ^ call_terms(call)  # those of dropout_seed(seed, epoch, index, call)
        scale = scaled_mask(terms, shape, p, x)  # the mask's size (one value per channel in 2d)
        return x.mul_(scale) if inplace else x * scale  # one pass over x, one node in the backward


class Routing:
    """While a training forward of an exact model runs (in any thread), ``torch.nn.functional``'s
    dropout functions are replaced by ones that send a call to the :class:`SampleDropout` of this
    thread's forward in progress, and to torch's own function from any other thread. Cheaper than
    the mode, which intercepts every torch function of the forward (13 in the example's Net: 3% of
    its training step); a function called by another name is not routed, which the first training
    forward checks with the mode (``routed_only``)."""

    def __init__(self):
        self.lock, self.local, self.users, self.saved = threading.Lock(), threading.local(), 0, {}
        self.routed = {}
        for func in _SIGNATURES:
            self.routed[func.__name__] = routed = self._routed(func)
            _UNROUTED[routed] = func

    def _routed(self, func):
        @functools.wraps(func)
        def routed(*args, **kwargs):
            modes = getattr(self.local, "modes", None)
            return modes[-1].handle(func, args, kwargs) if modes else func(*args, **kwargs)

        return routed

    def enter(self, mode: SampleDropout) -> None:
        with self.lock:
            if self.users == 0:
                self.saved = {name: getattr(F, name) for name in self.routed}
                for name, routed in self.routed.items():
                    setattr(F, name, routed)
            self.users += 1
        self.local.__dict__.setdefault("modes", []).append(mode)

    def leave(self) -> None:
        self.local.modes.pop()
        with self.lock:
            self.users -= 1
            if self.users == 0:
                for name, func in self.saved.items():
                    setattr(F, name, func)


ROUTING = Routing()


def exact_dropout(model: torch.nn.Module, balancer) -> torch.nn.Module:
    """Make ``model``'s dropout masks per global sample; returns ``model``.

    Row i of the j-th dropout call of a training forward is drawn from (seed, epoch, sample
    index, j), whatever rank, split or micro-batch the sample is in; ``nn.Dropout``,
    ``nn.Dropout1d/2d/3d``, ``F.dropout`` and ``F.dropout1d/2d/3d`` are covered as the model
    calls them. Alpha dropout, a training forward over part of the loader's batch, and a dropout
    function called by another name than ``torch.nn.functional``'s (seen in the first training
    forward) and a dropout under activation checkpointing are refused in one line (docs/exactness.md).

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

    bound = getattr(model, "_bno_dropout_balancer", None)
    if bound is not None:  # made exact before: its hooks follow this balancer now (a new generation, bno.elastic)
        bound[0] = balancer
        return model
    bound = model._bno_dropout_balancer = [balancer]

    def keys():
        step = bound[0].current_step
        if step is None or not step.keys:
            raise UsageError(
                "exact_dropout: a training forward outside a batch of the balancer's loader "
                "(bno_hvd.DataLoader or balancer.loader)"
            )
        return step.keys if step.rows is None else step.keys[step.rows]  # a micro-batch: its rows' keys

    mode = SampleDropout(keys, balancer.sampler.seed)
    mode.routed_only = True
    checked = []  # a training forward ran to its end under the mode too: every dropout call is routed
    entered = []  # per forward in progress: (training, checking) (eval draws nothing)

    def enter(module, inputs):
        entered.append((module.training, module.training and not checked))
        if module.training:
            mode.calls = 0
            ROUTING.enter(mode)
            if entered[-1][1]:
                mode.__enter__()

    def leave(module, inputs, output):
        training, checking = entered.pop()
        if checking:
            mode.__exit__(None, None, None)
            if sys.exc_info()[0] is None:  # not called on an error out of the forward
                checked.append(True)
        if training:
            ROUTING.leave()

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)
    return model
