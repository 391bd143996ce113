"""The drop-in surface: a Horovod script becomes heterogeneity-aware without a call inside its loop.

Three lines change in a Horovod script (docs/porting.md has the whole port)::

    import bno_hvd as bno
    train_sampler = bno.Balancer.for_world(train_dataset, args.batch_size)    # was DistributedSampler
    train_loader = bno.DataLoader(train_dataset, sampler=train_sampler, **kwargs)
    optimizer = bno.DistributedOptimizer(optimizer, balancer=train_sampler, named_parameters=...)

and the loop stays Horovod's: ``for data, target in train_loader: ... loss.backward();
optimizer.step()``. What happens instead of the explicit calls (:mod:`bno_hvd.library.balancer`):

- :class:`DataLoader` yields what torch's DataLoader would (the collated batch); a batch's
  arrival starts its step (``start_step``: the batch is checked against the plan, the clock starts).
- :func:`DistributedOptimizer` is ``hvd.DistributedOptimizer`` with ``op=hvd.Sum`` and a tensor
  hook on every parameter. Horovod launches a parameter's allreduce from a hook on its gradient
  accumulator, i.e. *after* the gradient was accumulated; a tensor hook runs *before* that, so each
  backward pass's gradient is scaled by this rank's share n_r / sum(n) before it reaches
  ``p.grad`` and the allreduce (also with ``backward_passes_per_step``: every pass is scaled).
  The end of the last backward pass ends the compute phase (an autograd-engine callback);
  ``step()`` waits for the allreduce, steps, and ends the update (every K updates: rebalance).
- A :class:`~bno_hvd.common.errors.UsageError` that ends the script is one ``bno-hvd: error:``
  line on stderr and exit code 2, as in the CLI
  (:func:`~bno_hvd.processes.world.one_line_errors`).
"""

from __future__ import annotations

import types

import torch

from bno_hvd.allocation.sampler import updates_left
from bno_hvd.allocation.weighting import gradient_reduction, keeps_batches_even, scaled_lr
from bno_hvd.common.arguments import check_flag, check_int, check_keys, check_number, describe, first_line
from bno_hvd.common.errors import UsageError, import_horovod
from bno_hvd.library.balancer import Balancer
from bno_hvd.library.sitout import EpochStopped, SitOut, mpi_groups, mpi_sum
from bno_hvd.processes.collectives import wait_for_allreduce
from bno_hvd.processes.collector import hold_setup
from bno_hvd.processes.world import one_line_errors

__all__ = ["DataLoader", "DistributedOptimizer"]

_SETUP_HELD: list = []  # not empty once a loader's first `for` kept what exists out of the collector's walks


class DataLoader:
    """Where a Horovod script has ``torch.utils.data.DataLoader(dataset, batch_size=B,
    sampler=DistributedSampler(...), **options)``: ``DataLoader(dataset, sampler=balancer, **options)``.

    Iterating yields exactly what torch's DataLoader would (the collated batch, e.g.
    ``(data, target)``), this rank's slice of each global batch; the arrival of a batch starts its
    step. Batch size and order belong to the balancer, so ``batch_size``, ``shuffle``,
    ``sampler`` (other than the balancer), ``batch_sampler`` and ``drop_last`` are refused;
    loading options (``num_workers``, ``pin_memory``, ``collate_fn``, ...) are passed on.

    One ``for`` over it is one epoch of the balancer's stream, from where the stream stands.
    ``len()`` is the number of batches the ``for`` in progress (or the next one) yields, at the
    newest global batch: exact unless the global batch changes during the epoch (only ``bno``
    changes it).

    Args:
        dataset: the training set the balancer was built for (a map-style ``Dataset``).
        sampler: the :class:`~bno_hvd.Balancer` (``Balancer.for_world``): it sets each batch's
            size and samples.
        **options: torch ``DataLoader``'s loading options (``num_workers``, ``pin_memory``,
            ``collate_fn``, ``persistent_workers``, ...).

    Example::

        train_sampler = bno.Balancer.for_world(train_set, 32)   # was DistributedSampler(train_set)
        train_loader = bno.DataLoader(train_set, sampler=train_sampler, num_workers=2)
        for epoch in range(epochs):
            train_sampler.set_epoch(epoch)                # accepted; changes nothing
            for data, target in train_loader:             # this rank's slice of each global batch
                ...
    """

    def __init__(self, dataset, sampler=None, **options):
        if not isinstance(sampler, Balancer):
            raise UsageError(
                "bno_hvd.DataLoader needs sampler=<the Balancer> (Balancer.for_world(...)), "
                f"got {type(sampler).__name__}"
            )
        one_line_errors()
        if sampler.max_batch is not None or sampler.max_tokens is not None:
            raise UsageError(
                "a memory cap (max_batch=, max_tokens=) splits a rank's batch into micro-batches, which a script's "
                "own loop does not run: drop it here (bno-hvd train --max-batch and the explicit API run them)"
            )
        self.dataset, self.sampler, self.balancer = dataset, sampler, sampler
        self.loader = sampler.loader(dataset, **options)  # the DataLoader of Batch objects (checks options)
        self._pass: tuple[int, int] | None = None  # (first update, epoch) of the `for` in progress

    def __iter__(self):
        bal = self.balancer
        if not _SETUP_HELD:  # once, at the first `for`: full collections then skip the script's setup (a walk
            _SETUP_HELD.append(hold_setup())  # stalled a starved rank's update 0.1-2 s: processes/collector.py)
        try:
            bal.finish_step()  # a batch whose optimizer.step() never came ends here, before the next is drawn
            batches = iter(self.loader)
            self._pass = (bal.update, bal.sampler.epoch)
            while True:
                bal.finish_step()
                try:
                    batch = next(batches)
                except StopIteration:
                    if bal.sit_out is not None:
                        bal.sit_out.catch_up()  # the script evaluates next: every rank with the current model
                    return
                if bal.sit_out is not None:
                    try:  # rank 0's word to a rank out, its state to a rank back (library/sitout.py)
                        bal.sit_out.begin(bal.batch_sizes)
                    except EpochStopped:  # rank 0's `for` ended early (a break): this one ends too
                        return
                bal.start_step(batch)
                if batch.size == 0:  # this rank sits the update out: finish_step() above ends it
                    if bal.sit_out is None:
                        raise UsageError(
                            "this rank has 0 samples in the split, which only bno_hvd.DistributedOptimizer or "
                            "bno_hvd.DistributedDataParallel can sit out: wrap the optimizer or the model with one"
                        )
                    continue
                yield batch.data
        except GeneratorExit:  # the script left its `for` early: ranks out wait for rank 0's word
            if bal.sit_out is not None:
                bal.finish_step()
                bal.sit_out.stop()
            raise
        finally:
            self._pass = None

    def __len__(self) -> int:
        bal = self.balancer
        position, total = bal.sampler.position, sum(bal.latest_counts())
        if self._pass is None:
            return updates_left(bal.sampler.dataset_len, position.offset, total)
        first, epoch = self._pass
        left = updates_left(bal.sampler.dataset_len, position.offset, total) if position.epoch == epoch else 0
        return bal.update - first + left


def DistributedOptimizer(  # noqa: N802 - Horovod's name, so that a port changes one word
    optimizer,
    named_parameters=None,
    *,
    balancer,
    op=None,
    gradient_predivide_factor=1.0,
    lr_scaling="linear",
    **horovod_options,
):
    """``hvd.DistributedOptimizer`` for uneven batches: the update is exactly the single-process
    update on the whole global batch. Takes Horovod's arguments (``compression``,
    ``backward_passes_per_step``, ``groups``, ``sparse_as_dense``, ...) and ``balancer``.

    ``op``: ``hvd.Average`` (the default, as in Horovod): the mean gradient over the global batch,
    for losses that average over their batch; ``hvd.Sum``: gradients summed unweighted, for losses
    that sum over samples; ``hvd.Adasum`` only where batches are always even (``equal``).
    ``gradient_predivide_factor`` other than 1 is refused. ``lr_scaling='linear'``: when the
    strategy changes the global batch (``bno``), each step uses lr * G_t / G (G_t this update's
    global batch, G the strategy's); ``'none'``: the learning rate as set.

    Args:
        optimizer: the torch optimizer over the model's parameters.
        named_parameters: ``model.named_parameters()``, as Horovod takes them.
        balancer: the :class:`~bno_hvd.Balancer` whose loader feeds the model.
        op: ``hvd.Average`` (None: the default), ``hvd.Sum`` or ``hvd.Adasum`` (above).
        gradient_predivide_factor: only 1.
        lr_scaling: ``'linear'`` or ``'none'`` (above).
        **horovod_options: passed on to ``hvd.DistributedOptimizer``.

    Example::

        model = bno.exact(Net(), train_sampler)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = bno.DistributedOptimizer(optimizer, model.named_parameters(), balancer=train_sampler)
    """
    one_line_errors()
    hvd = import_horovod()
    if not isinstance(balancer, Balancer):
        raise UsageError(f"DistributedOptimizer needs balancer=<the Balancer>, got {type(balancer).__name__}")
    if hasattr(optimizer, "synchronize"):
        raise UsageError("pass the plain torch optimizer: bno_hvd.DistributedOptimizer wraps it in Horovod's itself")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"DistributedOptimizer wraps a torch.optim optimizer, got {describe(optimizer)}")
    if not isinstance(lr_scaling, str) or lr_scaling not in ("linear", "none"):
        raise UsageError(f"lr_scaling must be 'linear' or 'none', got {describe(lr_scaling)}")
    check_number("gradient_predivide_factor", gradient_predivide_factor, 0, 1e6)
    check_horovod_options(hvd, horovod_options)
    if horovod_options.get("process_set", hvd.global_process_set) is not hvd.global_process_set:
        raise UsageError("process_set: the balancer's shares are over every rank; use the global process set")
    names = {hvd.Average: "average", hvd.Sum: "sum", hvd.Adasum: "adasum", hvd.Min: "min", hvd.Max: "max"}
    strategy = balancer.strategy
    even = keeps_batches_even(strategy.name, strategy.initial())
    known = isinstance(op, int) and not isinstance(op, bool) and op in names
    user_op = "average" if op is None else names[op] if known else describe(op)
    reduce_op, weighted = gradient_reduction(user_op, even, gradient_predivide_factor)
    try:
        wrapped = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=named_parameters,
            op=hvd.Adasum if reduce_op == "adasum" else hvd.Sum,
            **horovod_options,
        )
    except (TypeError, ValueError) as err:  # Horovod's checks of named_parameters and groups
        raise UsageError(f"hvd.DistributedOptimizer refused the arguments: {first_line(err)}") from None
    params = [p for group in wrapped.param_groups for p in group["params"] if p.requires_grad]
    balancer.gradients_weighted = weighted  # exact BatchNorm's backward works in the same frame (library/batchnorm.py)
    wrapped._bno_driver = _StepDriver(balancer, params, weighted, lr_scaling, wrapped.step)
    wrapped.step = types.MethodType(_step, wrapped)  # bound, as LR schedulers expect (they wrap step.__func__)
    wrapped.synchronize = types.MethodType(_synchronize, wrapped)  # step() calls it too
    if balancer.sit_out_wanted is not False and balancer.size > 1 and reduce_op != "adasum":
        _sit_out_beside_horovod(balancer, wrapped)
    return wrapped


def _sit_out_beside_horovod(balancer, wrapped) -> None:
    """Ranks that sit an update out leave it to the others (bno_hvd/library/sitout.py): in such an
    update Horovod's allreduce is set aside (its hooks submit nothing), and ``synchronize`` sums
    the gradients over an MPI communicator of the ranks that compute."""
    comm = balancer.control.plane.comm
    if not callable(getattr(comm, "Create_group", None)):  # a TorchComm: no MPI beside Horovod
        return
    balancer.sit_out = SitOut(balancer, mpi_groups(comm.Dup()), mpi_sum)
    balancer.sit_out.note_optimizer(wrapped)
    for name in ("_allreduce_grad_async", "_grouped_allreduce_grad_async"):
        submit = getattr(wrapped, name, None)
        if submit is not None:
            setattr(wrapped, name, _unless_someone_is_out(balancer.sit_out, submit))


def _unless_someone_is_out(sit_out, submit):
    def deferred(*args):
        return (None, None) if sit_out.group is not None else submit(*args)

    return deferred


def check_horovod_options(hvd, options: dict) -> None:
    """What DistributedOptimizer passes on to Horovod's, checked before Horovod uses it (a bad
    compression or group would fail only at the first step, inside Horovod)."""
    check_keys("DistributedOptimizer", options, HOROVOD_OPTIONS)
    check_int("backward_passes_per_step", options.get("backward_passes_per_step", 1), 1, 10**6)
    if "num_groups" in options:  # Horovod warns that it is deprecated
        raise UsageError("num_groups is deprecated by Horovod; pass groups=<number of groups> instead")
    check_flag("sparse_as_dense", options.get("sparse_as_dense", False))
    compression = options.get("compression", hvd.Compression.none)
    if not all(callable(getattr(compression, f, None)) for f in ("compress", "decompress")):
        raise UsageError(f"compression must be hvd.Compression.none or .fp16, got {describe(compression)}")
    groups = options.get("groups")
    if groups is not None and not isinstance(groups, list):
        check_int("groups", groups, 1, 10**6, "or a list of lists of parameters")


HOROVOD_OPTIONS = ("compression", "backward_passes_per_step", "num_groups", "groups", "sparse_as_dense", "process_set")


def _step(self, *args, **kwargs):
    return self._bno_driver.step(self, *args, **kwargs)


def _synchronize(self):
    sit_out = self._bno_driver.balancer.sit_out
    if sit_out is not None and sit_out.group is not None:  # some rank sits this update out
        _sum_over_those_computing(self, sit_out)
        return None
    # Horovod's synchronize() waits for each allreduce in a loop of yields: on a rank under a CPU
    # limit that spins the quota away from Horovod's background thread, which does the allreduce
    # (bno_hvd/processes/collectives.py). Polling with sleeps first, it finds them done.
    wait_for_allreduce(import_horovod(), self)
    return type(self).synchronize(self)


def _sum_over_those_computing(optimizer, sit_out) -> None:
    """What Horovod's synchronize() does, over the ranks that compute this update: every gradient
    (zeros for a parameter without one, as Horovod's) summed in one buffer."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    sit_out.allreduce_(flat)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
        offset += p.numel()
        optimizer._allreduce_delay[p] = optimizer.backward_passes_per_step
    optimizer._handles.clear()
    optimizer._synchronized = True


class _StepDriver:
    """The balancer's side of each optimizer step (see the module doc)."""

    def __init__(self, balancer, params, weighted: bool, lr_scaling: str, inner_step):
        self.balancer, self.weighted, self.lr_scaling, self.inner_step = balancer, weighted, lr_scaling, inner_step
        self._queued = False  # the end-of-backward callback is queued for the pass under way
        self.hooks = [p.register_hook(self._scale) for p in params]

    def _scale(self, grad):
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        step = self.balancer.current_step
        if step is None:
            # Raised here, before any allreduce of this backward pass starts, on every rank alike:
            # from step() a rank that left first would shut Horovod down under the others' allreduces.
            self._queued = False
            raise UsageError(
                "a backward pass for a batch that did not come from the balancer: build the loader with "
                "bno_hvd.DataLoader(dataset, sampler=balancer, ...)"
            )
        return grad * step.weight if self.weighted else None

    def _backward_done(self):
        self._queued = False
        self.balancer.mark_backward_end()

    def step(self, optimizer, *args, **kwargs):
        bal = self.balancer
        if bal.current_step is None:
            raise UsageError(
                "optimizer.step() for a batch that did not come from the balancer: build the loader with "
                "bno_hvd.DataLoader(dataset, sampler=balancer, ...)"
            )
        if not bal.compute_ended:
            bal.end_compute()
        factor = self.lr_factor(bal.current_step.global_batch)
        saved = [group["lr"] for group in optimizer.param_groups]
        if factor != 1.0:
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * factor
        try:
            out = self.inner_step(*args, **kwargs)
        finally:
            for group, lr in zip(optimizer.param_groups, saved):
                group["lr"] = lr  # the user's value (a scheduler's) stays theirs
        self._queued = False
        bal.end_step()
        return out

    def lr_factor(self, global_batch: int) -> float:
        strategy = self.balancer.strategy
        if self.lr_scaling == "none" or not strategy.changes_global_batch:
            return 1.0
        return scaled_lr(1.0, global_batch, 1, strategy.global_batch, self.lr_scaling)
