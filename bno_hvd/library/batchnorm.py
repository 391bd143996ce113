"""BatchNorm over the global batch, so that N ranks with uneven batches train exactly as one process.

A plain ``nn.BatchNorm2d`` normalises each rank's batch by that batch's own mean and variance: with
the global batch split 1,7,3,5 over 4 ranks the rank with 1 image normalises it by itself, the
outputs, gradients and running statistics are no longer those of one process holding all 16, and
``BatchNorm1d`` refuses a batch of one. :func:`exact_batchnorm` replaces every BatchNorm layer of a
model by a :class:`GlobalBatchNorm` that uses the statistics of the global batch:

- forward: one small allreduce (``op=Sum``; Horovod's, or torch.distributed's with the torch
  engine or a DDP script) per layer of [count, sum, sum of squares] per channel (float64), over
  the ranks that compute this update; mean and biased variance from them;
- backward (a ``torch.autograd.Function``): one more of the sums of ``dy`` and ``dy * xhat``, the
  two global terms of BatchNorm's input gradient; the weight and bias gradients stay local sums,
  which the gradient allreduce adds up as it does every parameter's;
- running statistics: the global mean and the unbiased global variance, so they are equal on every
  rank and equal to one process's (``momentum=None``: the cumulative average, as torch's);
- eval mode uses the running statistics (and a layer without them its own batch's, as torch's
  does): no communication.

Same parameters, buffers and ``state_dict`` keys as the layer it replaces (the very tensors: an
optimizer built before the conversion keeps working), on the CPU and on GPUs (the allreduce of
CPU or GPU tensors, like the gradients'). A rank with 0 samples sits the update out
and runs no forward, so the allreduces run on the process set of the ranks that compute (the same
one the gradients use, :mod:`bno_hvd.library.catchup`; in a script, the drop-in's group of them,
:mod:`bno_hvd.library.sitout`); a rank with 1 sample is fine. Every
training forward must see this rank's whole batch: micro-batches under a memory cap cannot have
global statistics (refused in one line). Layers that use batch statistics and that the conversion
does not know (``InstanceNorm`` with running statistics, a third-party ``...Norm``) get one
``bno-hvd: note:``.

Usage::

    model = bno.exact_batchnorm(torchvision.models.resnet18(), balancer)   # or bno.exact(model, balancer)
"""

from __future__ import annotations

import functools
import sys
import time

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from bno_hvd.common.errors import UsageError
from bno_hvd.library.dropout import refuse_checkpointing
from bno_hvd.processes.collectives import running_collectives, wait_handles

__all__ = ["GlobalBatchNorm", "exact_batchnorm", "inexact_norms"]

# per-sample normalisations (no statistics across samples): nothing to convert, nothing to say
_PER_SAMPLE = (nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm, nn.CrossMapLRN2d, nn.RMSNorm)
_DIMS = {nn.BatchNorm1d: (2, 3), nn.BatchNorm2d: (4,), nn.BatchNorm3d: (5,)}  # input dims each accepts


class GlobalBatchNorm(_BatchNorm):
    """A BatchNorm layer (1d, 2d or 3d) whose training statistics are the global batch's.

    Built by :func:`exact_batchnorm` from an existing layer; ``context`` gives, per training
    forward, what the layer needs to know of the update in progress (:class:`UpdateContext`)."""

    def __init__(self, layer: _BatchNorm, context, name: str):
        super().__init__(layer.num_features, layer.eps, layer.momentum, affine=False, track_running_stats=False)
        self.affine, self.track_running_stats = layer.affine, layer.track_running_stats
        for key in ("weight", "bias"):  # the same Parameter objects: the optimizer's references stay valid
            setattr(self, key, getattr(layer, key))
        for key in ("running_mean", "running_var", "num_batches_tracked"):
            self.register_buffer(key, getattr(layer, key))
        self.training = layer.training
        self.dims = next((d for cls, d in _DIMS.items() if isinstance(layer, cls)), None)
        self.kind, self.context, self.tag = type(layer).__name__, context, name

    def _check_input_dim(self, x):
        if x.dim() < 2 or (self.dims is not None and x.dim() not in self.dims):
            raise ValueError(f"{self.kind}: expected {' or '.join(f'{d}D' for d in self.dims)} input, got {x.dim()}D")

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, from={self.kind}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if not self.training:  # running statistics, or this batch's where there are none: no communication
            return super().forward(x)
        refuse_checkpointing(f"exact_batchnorm: {self.kind} {self.tag!r}")  # a recomputation would update twice
        ctx = self.context(x.shape[0])
        updating = self.track_running_stats and self.running_mean is not None
        factor = 0.0
        if updating:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        return _GlobalNorm.apply(
            x,
            self.weight,
            self.bias,
            self.running_mean if updating else None,
            self.running_var if updating else None,
            factor,
            self.eps,
            ctx,
            self.tag,
        )


class UpdateContext:
    """What a training forward of a :class:`GlobalBatchNorm` needs of the update in progress.

    ``reduce(tensor, name)``: sum ``tensor`` in place over the ranks that compute (Horovod, op=Sum);
    ``frame``: the factor this rank's gradients get after the backward (the drop-in's optimizer
    weights each rank's gradients by its share n_r / N instead of its loss: 1 where the loss is
    weighted)."""

    def __init__(self, reduce, frame: float, rank: int):
        self.reduce, self.frame, self.rank = reduce, frame, rank


class _GlobalNorm(torch.autograd.Function):
    """torch's own kernels around the two allreduces (each a pass or two over the layer's input,
    about half the CPU time of the same arithmetic in separate tensor operations):
    ``batch_norm_update_stats`` for this rank's moments, an eval-mode ``batch_norm`` with the
    global moments for the output and for the input gradient's global terms, and
    ``native_batch_norm_backward`` for the local sums of ``dy`` and ``dy * xhat``."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, factor, eps, update, tag):
        acc = torch.promote_types(x.dtype, torch.float32)  # statistics of half inputs in float32
        channels = x.shape[1]
        count = x.numel() // channels if channels else 0
        sums = torch.empty(1 + 2 * channels, dtype=torch.float64, device=x.device)
        sums[0] = count
        xa = x.to(acc)
        if count:
            mean, var = (m.double() for m in torch.batch_norm_update_stats(xa, None, None, 0.0))  # stable moments
            sums[1 : 1 + channels] = mean * count
            sums[1 + channels :] = (var + mean**2) * count
        else:
            sums[1:] = 0
        update.reduce(sums, f"bno.bn.{tag}.stats")
        total = int(round(float(sums[0])))
        if total <= 1:
            raise UsageError(
                f"BatchNorm in training needs more than 1 value per channel over the global batch, got {total}"
            )
        g_mean = sums[1 : 1 + channels] / total
        g_var = (sums[1 + channels :] / total - g_mean**2).clamp_min(0)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - factor).add_(g_mean.to(running_mean.dtype), alpha=factor)
                unbiased = g_var * (total / (total - 1))
                running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)
        mean, var, invstd = g_mean.to(acc), g_var.to(acc), torch.rsqrt(g_var + eps).to(acc)
        w, b = (None if t is None else t.to(acc) for t in (weight, bias))
        y = _normalise(xa, w, b, mean, var, eps)
        ctx.save_for_backward(xa, mean, var, invstd, weight)
        ctx.total, ctx.update, ctx.tag, ctx.eps, ctx.dtype = total, update, tag, eps, x.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xa, mean, var, invstd, weight = ctx.saved_tensors
        dy = dy.to(xa.dtype)
        # the local sums of dy (the bias gradient) and of dy * xhat (the weight's) in one pass; ones
        # as the weight where the layer has none: the sums do not depend on it, and no device's
        # kernel then meets a missing weight (only the CPU's is tested here)
        _, local_dy_xhat, local_dy = torch.ops.aten.native_batch_norm_backward(
            dy, xa, torch.ones_like(mean), None, None, mean, invstd, True, ctx.eps, [False, True, True]
        )
        dx = None
        if ctx.needs_input_grad[0]:  # the same on every rank (one model), so every rank reduces or none
            c = local_dy.numel()
            both = torch.cat([local_dy, local_dy_xhat]).double() * ctx.update.frame  # in the global loss's frame
            ctx.update.reduce(both, f"bno.bn.{ctx.tag}.grads")
            both = both / (ctx.update.frame * ctx.total)  # back in this rank's frame, as means
            mean_dy, mean_dy_xhat = both[:c].to(dy.dtype), both[c:].to(dy.dtype)
            scale = invstd if weight is None else weight.to(dy.dtype) * invstd
            # dx = scale * (dy - mean_dy - xhat * mean_dy_xhat): its last two terms are an eval-mode
            # BatchNorm of the input (xhat times a weight, plus a bias), then scale * dy added
            terms = _normalise(xa, -scale * mean_dy_xhat, -scale * mean_dy, mean, var, ctx.eps)
            dx = terms.addcmul_(dy, scale.view([1, -1] + [1] * (dy.dim() - 2))).to(ctx.dtype)
        dw = local_dy_xhat.to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        db = local_dy.to(weight.dtype) if weight is not None and ctx.needs_input_grad[2] else None
        return dx, dw, db, None, None, None, None, None, None


def _normalise(x, weight, bias, mean, var, eps: float) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` per channel in one pass (an eval-mode
    ``batch_norm``; ``weight`` and ``bias`` may be None)."""
    return torch.batch_norm(x, weight, bias, mean, var, False, 0.0, eps, torch.backends.cudnn.enabled)


def exact_batchnorm(model: nn.Module, balancer, *, process_sets=None) -> nn.Module:
    """Replace ``model``'s BatchNorm layers by ``GlobalBatchNorm``, which normalises by the global
    batch's statistics, forward and backward (docs/exactness.md); returns ``model``. Prints one
    ``bno-hvd: note:`` (rank 0) naming the layers that use batch statistics and stay as they are.
    Collective in no way: call it on every rank alike, before the first training forward.

    Args:
        model: the ``nn.Module`` whose ``BatchNorm1d/2d/3d`` (and ``SyncBatchNorm``) layers are
            replaced in place; parameters, buffers and ``state_dict`` keys stay the same. Layers
            converted before (by an earlier call) follow ``balancer`` from now on.
        balancer: the :class:`~bno_hvd.Balancer` whose batches the model trains on (each
            update's split: who computes, this rank's rows).
        process_sets: the ``bno_hvd.processes.sitsets.SitOutSets`` of a loop in which ranks with
            0 samples sit out (``World.sit_out_sets``; the loop asks it for each update's set
            first); None: every rank always computes.

    Example::

        model = bno.exact_batchnorm(torchvision.models.resnet18(num_classes=10), train_sampler)
        for data, target in train_loader:    # bno.DataLoader: each forward takes the whole batch
            ...                              # normalised by the global batch's statistics
        model.eval()                         # the running statistics, with no communication
    """
    collectives = functools.cache(running_collectives)  # the job's, found at the first training forward

    def reduce(tensor, name, sizes):
        start = time.perf_counter()
        out = [r for r, b in enumerate(sizes) if b == 0]
        if out and process_sets is None:
            if balancer.sit_out is None:
                raise UsageError("exact_batchnorm: a rank has 0 samples; pass process_sets=world.sit_out_sets")
            balancer.sit_out.allreduce_(tensor)  # a drop-in's group of the ranks that compute
        else:
            hvd = collectives()
            where = process_sets.without(out) if out else hvd.global_process_set
            wait_handles(hvd, [handle := hvd.allreduce_async_(tensor, op=hvd.Sum, name=name, process_set=where)])
            hvd.synchronize(handle)
        balancer.timer.waited(time.perf_counter() - start)  # waiting for the slowest rank is not compute

    def context(rows: int) -> UpdateContext:
        step = balancer.current_step
        if step is None:
            raise UsageError(
                "exact_batchnorm: a training forward outside a batch of the balancer's loader "
                "(bno_hvd.DataLoader or balancer.loader); call model.eval() for other forwards"
            )
        if rows != step.size:
            raise UsageError(
                f"exact_batchnorm: a training forward over {rows} rows, but this rank's batch has {step.size} "
                "samples; run the model on the whole batch (BatchNorm cannot be exact over micro-batches)",
                rank=balancer.rank,
            )
        frame = step.weight if balancer.gradients_weighted else 1.0
        return UpdateContext(lambda t, name: reduce(t, name, step.batch_sizes), frame, balancer.rank)

    if all(m is not model for m in getattr(balancer, "models", [model])):
        balancer.models.append(model)  # its buffers travel to a rank back from sitting out (library/sitout.py)
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, _BatchNorm)]
    for index, (name, layer) in enumerate(layers):
        if isinstance(layer, GlobalBatchNorm):  # converted already: it follows this balancer now (a new
            layer.context = context  # generation of bno.elastic, whose balancer spans the new members)
            continue
        if not name:  # the model is one layer
            continue
        if isinstance(layer, nn.modules.lazy.LazyModuleMixin) and layer.has_uninitialized_params():
            raise UsageError(
                f"exact_batchnorm: {name} ({type(layer).__name__}) is not initialised; run a forward first"
            )
        _replace(model, name, GlobalBatchNorm(layer, context, str(index)))
    notes = inexact_norms(model)
    if notes and balancer.rank == 0:
        print(
            f"bno-hvd: note: {', '.join(notes)} normalise by the statistics of this rank's batch, not the global "
            "batch's: uneven batches are not exactly one process's update there",
            file=sys.stderr,
            flush=True,
        )
    return model


def inexact_norms(model: nn.Module) -> list[str]:
    """``"name (Class)"`` of each layer that uses batch statistics and is no :class:`GlobalBatchNorm`:
    an InstanceNorm with running statistics, a BatchNorm not converted, or a layer whose class name
    has ``Norm`` in it and that bno-hvd does not know."""
    found = []
    for name, m in model.named_modules():
        if isinstance(m, GlobalBatchNorm) or isinstance(m, _PER_SAMPLE):
            continue
        if isinstance(m, _InstanceNorm):
            if m.track_running_stats:
                found.append(f"{name} ({type(m).__name__} with running statistics)")
        elif isinstance(m, _BatchNorm) or "Norm" in type(m).__name__:
            found.append(f"{name or 'the model'} ({type(m).__name__})")
    return found


def has_batchnorm(model: nn.Module) -> bool:
    """Whether ``model`` holds a BatchNorm layer (converted or not)."""
    return any(isinstance(m, _BatchNorm) for m in model.modules())


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)
