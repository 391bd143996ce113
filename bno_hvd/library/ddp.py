"""Gradient sync by torch.distributed: ``DistributedDataParallel`` whose communication hook weights
each rank's gradients by its share of the global batch.

Each rank's loss is the mean over its own n_r samples. DDP's own hook divides every bucket by
the number of ranks, which is the global batch's mean only when batches are even. The hook here
multiplies the bucket by this rank's weight w_r = n_r / sum(n) (its share of the global batch's
tokens for text, see :class:`~bno_hvd.library.step.Step`) and all-reduces with SUM, so the result
is sum_r w_r * mean_r = the mean gradient over the global batch, exactly what one process would
compute on it. (With a hook registered DDP does not divide by the world size itself: the hook
owns the reduction.) The weight is read when the bucket is ready, so it is the current update's
and follows every rebalance.

Usage (the drop-in, :func:`bno_hvd.DistributedDataParallel`)::

    model = bno.DistributedDataParallel(model, balancer=train_sampler)   # was DDP(model)

bno-hvd's own training loop (``--engine torch``) does not use DDP: it sums the gradients after
each rank's compute phase, as with Horovod (:class:`bno_hvd.processes.torchworld.SummedGradients`).
"""

import weakref

import torch
import torch.distributed as dist

from bno_hvd.common.errors import UsageError
from bno_hvd.processes.torchenv import finish_at_exit

__all__ = ["DistributedDataParallel", "WeightedAllreduce", "balance_ddp", "weighted_allreduce_hook"]

# Every hooked DDP's process group, kept until the interpreter exits. A script that calls
# destroy_process_group() while its DDP model lives (torch's tutorial does) leaves the model's Reducer
# the last reference to the Gloo group, and torch frees the group from there with the GIL held: its
# destructor joins the group's worker thread, which may still be freeing the last allreduce's work
# and waits for the GIL, so the rank never exits (pytorch/pytorch#56297; docs/ddp.md). Kept here,
# the group is freed from Python, which releases the GIL first: at exit, once the model is gone
# (bno_hvd.processes.torchenv.finish_process_group), not in the interpreter's finalization.
_KEPT_GROUPS: list = []  # (a weak reference to the DDP model, its group)


def release_kept_groups() -> None:
    """Drop the kept groups whose DDP model is gone (freed here, from Python)."""
    _KEPT_GROUPS[:] = [(model, group) for model, group in _KEPT_GROUPS if model() is not None]


# Under bno.elastic (on CPUs) the gradients of each generation's DDP models go over a group that
# DDP was not built on: the Balancer's control-plane group (collectives of every rank, called in the
# same order on each: the allreduce completes within the backward, before any control message). A
# Gloo group that a DDP model was built on outlives the model and destroy_process_group() (torch
# 2.13: tests/processes/test_gloo_release.py), so a rank whose allreduce failed kept that group's
# connections open and a survivor waiting on one of them waited its whole timeout. The plane's
# group is dropped with the generation (release_generation_groups, TorchComm.close), which closes
# its connections and fails such a wait at once.
_GENERATION_STATES: list = []  # the WeightedAllreduce states whose group is a generation's control-plane group
_generation = [False]  # inside a generation of bno.elastic: a new DDP drop-in's gradients go over the plane's group


def generation_groups(on: bool) -> None:
    """Send the gradients of the DDP drop-ins made from now on over their Balancer's control-plane
    group (``on``: a generation of ``bno.elastic`` runs), or no longer."""
    _generation[0] = on


def release_generation_groups() -> None:
    """Drop the gradient groups of the generation that ended (its DDP models no longer step)."""
    for state in _GENERATION_STATES:
        state.group = None
    _GENERATION_STATES.clear()


class WeightedAllreduce:
    """The hook's state: ``weight()`` is this rank's factor for the update under way; ``group``
    the process group of the gradients (None: the default group); ``current()``, if given, this
    update's group instead where it returns one (the ranks that compute while others sit out)."""

    def __init__(self, weight, group=None, current=None):
        self.weight, self.group, self.current = weight, group, current

    def update_group(self):
        here = None if self.current is None else self.current()
        return self.group if here is None else here


def weighted_allreduce_hook(state: WeightedAllreduce, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: ``bucket * state.weight()``, all-reduced with SUM."""
    tensor = bucket.buffer()
    weight = float(state.weight())
    if weight != 1.0:
        tensor.mul_(weight)
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=state.update_group(), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def DistributedDataParallel(module, *, balancer, **ddp_options):  # noqa: N802 - torch's name, so a port changes one word
    """``torch.nn.parallel.DistributedDataParallel(module, **ddp_options)`` for uneven batches: the
    gradients are the mean over the whole global batch (``weighted_allreduce_hook``), so the
    update is the single-process update on it. ``balancer``: the Balancer whose loader
    (:class:`bno_hvd.DataLoader`) feeds ``module``. Takes DDP's options (``device_ids``,
    ``find_unused_parameters``, ``process_group``, ``gradient_as_bucket_view``, ...).

    The learning rate is used as set (a strategy that changes the global batch, ``bno``, would
    want it scaled: the Horovod drop-in's optimizer does that; here, scale it in the loop).

    Args:
        module: the plain model (not wrapped in torch's DDP yet), on its device.
        balancer: the :class:`~bno_hvd.Balancer` over every rank of the default process group.
        **ddp_options: passed on to ``torch.nn.parallel.DistributedDataParallel``.

    Example::

        dist.init_process_group("gloo")                      # under torchrun
        train_sampler = bno.Balancer.for_world(train_set, 32)
        train_loader = bno.DataLoader(train_set, sampler=train_sampler)
        model = bno.exact_dropout(Net(), train_sampler)
        model = bno.DistributedDataParallel(model, balancer=train_sampler)   # was DDP(model)
        for data, target in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()  # the mean over the global batch
            optimizer.step()
    """
    _check_world(balancer, module, ddp_options.get("process_group"))
    sit_out = balancer.sit_out_wanted is not False and balancer.size > 1 and _may_sit_out(balancer, module, ddp_options)
    ddp = torch.nn.parallel.DistributedDataParallel(module, **ddp_options)
    return _weigh(ddp, balancer, sit_out, ddp_options)


def balance_ddp(ddp, balancer, ddp_options: dict, *, early_sit_out: bool = False):
    """What :func:`DistributedDataParallel` does to the torch DDP model it builds, on one another
    library built (Accelerate's ``prepare``, :mod:`bno_hvd.library.frameworks`): the weighting hook,
    the step's ends, sit-out. ``ddp_options``: the options it was built with (``broadcast_buffers``
    given explicitly counts). ``early_sit_out``: the caller rebuilds DDP's buckets itself before a
    rank sits out of the first two updates (bno.lightning). Before the model's first forward; returns ``ddp``."""
    _check_world(balancer, ddp.module, ddp.process_group)
    sit_out = (
        balancer.sit_out_wanted is not False
        and balancer.size > 1
        and _may_sit_out(balancer, ddp.module, ddp_options, early_sit_out)
    )
    return _weigh(ddp, balancer, sit_out, ddp_options)


def _check_world(balancer, module, group) -> None:
    from bno_hvd.library.balancer import Balancer
    from bno_hvd.processes.world import one_line_errors

    one_line_errors()
    if not isinstance(balancer, Balancer):
        raise UsageError(f"DistributedDataParallel needs balancer=<the Balancer>, got {type(balancer).__name__}")
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        raise UsageError("pass the plain model: bno_hvd.DistributedDataParallel wraps it in torch's DDP itself")
    if not dist.is_initialized():
        raise UsageError("torch.distributed is not initialised: call torch.distributed.init_process_group() first")
    if dist.get_world_size(group) != balancer.size:
        raise UsageError(
            f"the process group has {dist.get_world_size(group)} ranks but the balancer {balancer.size}; "
            "the balancer's shares are over every rank of the job: use the default group"
        )


def _weigh(ddp, balancer, sit_out: bool, ddp_options: dict):
    if "broadcast_buffers" not in ddp_options and not _loose_buffers(ddp.module):
        ddp.broadcast_buffers = False  # exact BatchNorm's buffers are equal on every rank: no sync point per forward
    state = WeightedAllreduce(lambda: _weight(balancer), ddp.process_group)
    plane = getattr(balancer.control.plane.comm, "group", None)  # a TorchComm's Gloo group (under torchrun)
    if _generation[0] and plane is not None and _on_cpu(ddp.module) and ddp.process_group == dist.GroupMember.WORLD:
        state.group = plane  # every rank's; the allreduce completes in the backward, before any control message
        _GENERATION_STATES.append(state)
    ddp.register_comm_hook(state, weighted_allreduce_hook)
    _KEPT_GROUPS.append((weakref.ref(ddp), ddp.process_group))
    finish_at_exit()  # the kept group freed at exit, not in the interpreter's finalization
    balancer.gradients_weighted = True  # exact BatchNorm's backward works in the hook's frame (library/batchnorm.py)
    _StepEnds(balancer, ddp)
    if sit_out:
        _sit_out_beside_ddp(balancer, ddp, state)
    return ddp


def _on_cpu(module) -> bool:
    return all(p.device.type == "cpu" for p in module.parameters())


def _may_sit_out(balancer, module, ddp_options: dict, early: bool = False) -> bool:
    """Whether ranks of this DDP model can sit updates out (bno_hvd/library/sitout.py); refuses in
    one line what cannot work. DDP broadcasts rank 0's buffers at every forward over every rank, so
    only a model whose buffers are exact BatchNorm's (equal on every rank that computes) or none
    sits out; and DDP rebuilds its gradient buckets over every rank at its second update, so no
    rank may sit out before this process's third."""
    loose = _loose_buffers(module)
    synced = [k for k in ("broadcast_buffers", "forward_sync_buffers") if ddp_options.get(k)]
    zeros = any(0 in sizes for _, sizes in balancer.plan.changes)  # decided for this process's first updates
    if zeros and (loose or synced):
        raise UsageError(
            "a rank has 0 samples in the split, but this DDP model syncs its buffers at every forward over every "
            "rank (model buffers other than exact BatchNorm's, or broadcast_buffers=True): convert BatchNorm with "
            "bno.exact(model, balancer), or give every rank samples"
        )
    if zeros and not early:
        raise UsageError(
            "a rank has 0 samples in the first two updates: torch's DDP rebuilds its gradient buckets over every rank "
            "at its second; give every rank samples at first (a rank may sit out two updates after the start)"
        )
    return not loose and not synced


def _loose_buffers(module) -> list[str]:
    """The model's buffers other than exact BatchNorm's (which are equal on every rank that computes)."""
    from bno_hvd.library.batchnorm import GlobalBatchNorm

    own = (m for m in module.modules() if not isinstance(m, GlobalBatchNorm))
    return [name for m in own for name, _ in m.named_buffers(recurse=False)]


def _sit_out_beside_ddp(balancer, ddp, state) -> None:
    """Ranks that sit an update out leave it to the others: the hook all-reduces over a group of
    the ranks that compute (bno_hvd/library/sitout.py). What travels to a rank back: the model, and
    every optimizer that steps its parameters (seen at its first step)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from bno_hvd.library.sitout import SitOut, torch_sum
    from bno_hvd.processes.sitsets import SitOutSets

    sit_out = balancer.sit_out = SitOut(balancer, SitOutSets.torch(balancer.size), torch_sum)
    balancer.sit_out_from = balancer.update + 2  # DDP rebuilds its buckets over every rank at its second update
    state.current = lambda: sit_out.group
    if all(m is not ddp.module for m in balancer.models):
        balancer.models.append(ddp.module)
    mine = {id(p) for p in ddp.module.parameters()}

    def seen(optimizer, args, kwargs):
        if all(id(p) in mine for group in optimizer.param_groups for p in group["params"]):
            sit_out.note_optimizer(optimizer)

    while_alive(ddp, [register_optimizer_step_pre_hook(seen)])


def while_alive(ddp, handles) -> None:
    """Remove the hooks of ``handles`` once ``ddp`` is gone (a DDP model of an earlier generation of
    ``bno.elastic``, on the same parameters: its hooks would stay, each a no-op, on every step)."""
    weakref.finalize(ddp, _remove, handles)


def _remove(handles) -> None:
    for handle in handles:
        handle.remove()


def _weight(balancer) -> float:
    step = balancer.current_step
    return 1.0 if step is None else step.weight  # None: refused in the forward already


class _StepEnds:
    """The balancer's side of a DDP model: a training forward must belong to a batch of the
    balancer's loader (checked before DDP's first collective, on every rank alike), and the end
    of each backward pass ends the compute phase (an autograd-engine callback queued by the
    first gradient of the pass: it runs before DDP's own wait for the allreduce). The step ends with
    the ``step()`` of an optimizer over the model's parameters (so ``balancer.update`` counts it
    right after, as with the Horovod drop-in), or where none came (a GradScaler skipped it) when
    the loader draws the next batch (:class:`bno_hvd.DataLoader`)."""

    def __init__(self, balancer, ddp):
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.balancer, self._queued = balancer, False
        self.params = {id(p) for p in ddp.module.parameters()}
        ddp.register_forward_pre_hook(self._check)
        hooks = [p.register_hook(self._first_gradient) for p in ddp.module.parameters() if p.requires_grad]
        while_alive(ddp, [*hooks, register_optimizer_step_post_hook(self._stepped)])

    def _stepped(self, optimizer, args, kwargs):
        mine = all(id(p) in self.params for group in optimizer.param_groups for p in group["params"])
        if mine and self.balancer.current_step is not None:
            self.balancer.finish_step()

    def _check(self, module, inputs):
        if module.training and torch.is_grad_enabled() and self.balancer.current_step is None:
            raise UsageError(
                "a training forward for a batch that did not come from the balancer: build the loader with "
                "bno_hvd.DataLoader(dataset, sampler=balancer, ...)"
            )

    def _first_gradient(self, grad):
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        return None

    def _backward_done(self):
        self._queued = False
        self.balancer.mark_backward_end()
