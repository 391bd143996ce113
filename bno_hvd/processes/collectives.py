"""The Horovod operations of the training loop, done so that they cost a starved rank little CPU.

On a rank with a CPU quota every thread spends the same quota as the model. Two things in a
plain Horovod loop burn it while the rank only waits:

- ``optimizer.step()`` waits for the gradient allreduce in Horovod's ``WaitAndClear``, a loop of
  ``std::this_thread::yield()``: the main thread spins at 100% of the quota while Horovod's
  background thread needs that quota to do the allreduce. :func:`wait_for_allreduce` polls the
  handles and sleeps in between (backing off from 0.1 ms to 2 ms), so ``step()`` then finds them
  done. Measured (4 ranks, CNN, quotas 0.5,0.5,0.5,0.17 of a core): an update of 40,40,40,8
  samples fell from 189 ms to 65 ms.
- a second, blocking allreduce per update just to log the global loss: :class:`LossSum` submits
  it right after ``backward()``, so it rides in the gradients' negotiation cycle, and reads it
  after the step.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from bno_hvd.common.errors import UsageError

POLL_FIRST, POLL_MAX = 1e-4, 2e-3  # seconds between polls: first, and the cap of the back-off


def wait_for_allreduce(hvd, optimizer, extra=()) -> None:
    """Return when every gradient allreduce in flight (and the ``extra`` handles) has finished,
    sleeping instead of spinning. ``optimizer`` is a ``hvd.DistributedOptimizer``."""
    # _handles holds (handle, ctx) per parameter (or group) whose allreduce was submitted by the
    # backward hooks; None for parameters still accumulating. A handle may also be a callable
    # (Horovod's own sparse path): step() resolves those itself.
    handles = [h for h, _ in getattr(optimizer, "_handles", {}).values() if isinstance(h, int)]
    wait_handles(hvd, handles + [h for h in extra if h is not None])


def wait_handles(hvd, handles) -> None:
    """Poll Horovod ``handles`` until all are done, sleeping in between (0.1 ms, doubling to 2 ms):
    Horovod's own wait spins. torch.distributed's work waits without spinning (a condition
    variable, the GIL released): :class:`~bno_hvd.processes.torchworld.TorchCollectives` waits so,
    with no poll's latency after the end."""
    if hasattr(hvd, "wait_quietly"):
        for handle in handles:
            hvd.wait_quietly(handle)
        return
    sleep_until([lambda h=handle: hvd.poll(h) for handle in handles])


def sleep_until(tests) -> None:
    """Call each of ``tests`` until it returns True, sleeping in between (0.1 ms, doubling to 2 ms):
    a wait that leaves the CPU to the threads doing the work (MPI's and Horovod's waits spin)."""
    delay = POLL_FIRST
    for test in tests:
        while not test():
            time.sleep(delay)
            delay = min(POLL_MAX, 2 * delay)


def allreduce_alone(hvd, model, repeats: int = 20, warmup: int = 3) -> tuple[float, float]:
    """The gradient allreduce without any compute: one buffer of the model's gradient size and
    dtype, allreduced ``warmup + repeats`` times the way an update does it (fused, waited for by
    polling). Returns this rank's median wall seconds and median CPU seconds (every thread of
    the process: Horovod's and Gloo's included) per allreduce.

    It is the floor of an update's time outside compute: no allocation of samples can remove it.
    ``bench`` measures it at the start of each run, under the run's CPU quotas."""
    params = [p for p in model.parameters() if p.requires_grad]
    like = params[0] if params else torch.zeros(0)
    buf = torch.zeros(sum(p.numel() for p in params), dtype=like.dtype, device=like.device)
    walls, cpus = [], []
    for i in range(warmup + repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        wait_handles(hvd, [hvd.allreduce_async_(buf, op=hvd.Sum, name="bno.allreduce_alone")])
        if i >= warmup:
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def running_collectives():
    """The collectives of this job's gradients, in Horovod's shape: ``horovod.torch`` where Horovod
    is initialised, else torch.distributed's (the torch engine, a DDP script:
    :class:`bno_hvd.processes.torchworld.TorchCollectives`). :class:`UsageError` when neither is."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        return hvd
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from bno_hvd.processes.torchworld import TorchCollectives

        return TorchCollectives(None)
    raise UsageError(
        "neither Horovod nor torch.distributed is initialised: call hvd.init() or "
        "torch.distributed.init_process_group() before the first training forward"
    )


def set_passes(optimizer, passes: int) -> None:
    """Let Horovod accumulate ``passes`` backward passes (micro-batches) before it allreduces;
    ranks may differ (a rank's allreduce starts after its own last pass)."""
    # (the torch engine's optimizer has no such setting: it sums once, when submit_gradients says so)
    if getattr(optimizer, "backward_passes_per_step", passes) != passes:
        optimizer.set_backward_passes_per_step(passes)


def submit_gradients(optimizer) -> None:
    """The compute phase is over: the gradients' sum may start. Horovod's optimizer submitted each
    gradient from its backward hook already; the torch engine's submits them all now
    (:class:`bno_hvd.processes.torchworld.SummedGradients`)."""
    submit = getattr(optimizer, "submit", None)
    if submit is not None:
        submit()


def optimizer_step(optimizer, scaler=None) -> None:
    """``optimizer.step()``; with a GradScaler (``--amp`` on a GPU) the way Horovod's examples do it:
    finish the allreduce, unscale, step without synchronising again, update the scale."""
    if scaler is None:
        optimizer.step()
        return
    optimizer.synchronize()
    scaler.unscale_(optimizer)
    with optimizer.skip_synchronize():
        scaler.step(optimizer)
    scaler.update()


class LossSum:
    """The weighted loss summed over ranks (= the mean loss over the global batch), allreduced
    asynchronously beside the gradients.

    Usage::

        loss_sum = LossSum(hvd, loss * step.weight)   # after backward()
        wait_for_allreduce(hvd, optimizer, [loss_sum.handle])
        optimizer.step()
        value = loss_sum.value()
    """

    def __init__(self, hvd, weighted_loss, process_set=None):
        self.hvd = hvd
        where = {} if process_set is None else {"process_set": process_set}  # the gradients' ranks
        value = weighted_loss.detach().reshape(1).double()
        self.handle = hvd.allreduce_async(value, op=hvd.Sum, name="bno.loss", **where)

    def value(self) -> float:
        return float(self.hvd.synchronize(self.handle).item())
