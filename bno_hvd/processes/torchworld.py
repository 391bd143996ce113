"""The torch engine (``--engine torch``): torch.distributed in every rank instead of Horovod.

Gradients are summed by torch.distributed (Gloo on CPUs, NCCL on GPUs) after each rank's
compute phase (:class:`SummedGradients`); the control plane talks mpi4py under mpirun/srun, as with Horovod, and
torch.distributed collectives on a Gloo group of its own under torchrun
(:class:`~bno_hvd.processes.torchcomm.TorchComm`). The training loop asks ``world.hvd`` for a
few collectives besides the gradients' (the logged loss, the evaluation's sums, the initial
broadcast); :class:`TorchCollectives` answers them with torch.distributed, so the loop is the
same for both engines.

Not ``DistributedDataParallel`` in the loop: DDP reduces the gradients inside ``backward()``, so
a fast rank's backward pass also waits for the slowest rank, and what the strategies read as its
compute was wrong (EMULATED, speeds 1 : 0.3: 18 ms against 530 ms where Horovod's engine measured
162 ms against 535 ms; docs/ddp.md). Users' own DDP scripts keep DDP
(:func:`bno_hvd.DistributedDataParallel`), which marks the end of their compute at the end of
the backward pass.

Usage::

    world = init_world(engine="torch")          # under torchrun, or mpirun/srun (bno_hvd.processes.world)
    world.engine == "torch"; world.hvd.allreduce(tensor)
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from bno_hvd.processes.heap import keep_freed_memory
from bno_hvd.processes.mpienv import arrange_for_shared_cores


class TorchCollectives:
    """The Horovod calls bno-hvd's loop makes besides the gradients', over torch.distributed's
    default group (every rank): sums (``op`` is always a sum there), asynchronous handles that
    are polled, and rank 0's parameters and optimizer state sent to all; the gradients' sum is
    :meth:`DistributedOptimizer`'s. Where Horovod takes a ``process_set``, this takes a
    torch.distributed group (None: every rank)."""

    Sum = "sum"
    global_process_set = None  # the default group: every rank

    def __init__(self, comm):
        import torch.distributed as dist

        self._dist, self.comm = dist, comm
        self._work: dict[int, tuple] = {}
        self._next = 0

    def rank(self) -> int:
        return self._dist.get_rank()

    def size(self) -> int:
        return self._dist.get_world_size()

    def allreduce(self, tensor, op=Sum, name=None):
        out = tensor.clone()
        self._dist.all_reduce(out)
        return out

    def allreduce_async(self, tensor, op=Sum, name=None, process_set=None) -> int:
        return self.allreduce_async_(tensor.clone(), op, name, process_set)

    def allreduce_async_(self, tensor, op=Sum, name=None, process_set=None) -> int:
        handle, self._next = self._next, self._next + 1
        self._work[handle] = (self._dist.all_reduce(tensor, group=process_set, async_op=True), tensor)
        return handle

    def poll(self, handle: int) -> bool:
        return self._work[handle][0].is_completed()

    def wait_quietly(self, handle: int) -> None:
        """Until ``handle``'s allreduce is done, without spinning (see ``collectives.wait_handles``)."""
        self._work[handle][0].wait()

    def synchronize(self, handle: int):
        work, tensor = self._work.pop(handle)
        work.wait()
        return tensor

    def DistributedOptimizer(self, optimizer, named_parameters=None, op=None):  # noqa: N802 - Horovod's name
        return SummedGradients(optimizer, self)

    def broadcast_parameters(self, state: dict, root_rank: int = 0) -> None:
        for tensor in state.values():
            self._dist.broadcast(tensor, src=root_rank)

    def broadcast_optimizer_state(self, optimizer, root_rank: int = 0) -> None:
        mine = optimizer.state_dict() if self.comm.Get_rank() == root_rank else None
        optimizer.load_state_dict(self.comm.bcast(mine, root=root_rank))


class SummedGradients:
    """``optimizer`` whose gradients are summed over every rank before it steps, as
    ``hvd.DistributedOptimizer(op=hvd.Sum)`` does (the loop weights each rank's loss by its share,
    so the sum is the global batch's mean gradient). Horovod's hooks submit each gradient during
    backward; here :meth:`submit` starts one allreduce of them all, flattened, when the rank's
    compute phase is over, and ``step()`` waits for it. ``_handles`` is read the way Horovod's is
    (:func:`bno_hvd.processes.collectives.wait_for_allreduce` polls it instead of spinning);
    ``process_set``, the group of the ranks that compute (a rank may sit out), is set as on
    Horovod's optimizer (:class:`bno_hvd.library.catchup.CatchUp`)."""

    def __init__(self, optimizer, collectives: TorchCollectives):
        self.optimizer, self._collectives = optimizer, collectives
        self.process_set = None  # every rank
        self._handles: dict = {}
        self._grads: list = []
        self._synchronize = True

    def __getattr__(self, name):  # param_groups, zero_grad, state_dict, ...: the optimizer's
        return getattr(self.optimizer, name)

    def submit(self) -> None:
        """Start the gradients' sum (every rank, after its backward passes)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.requires_grad]
        for p in params:  # a parameter this batch did not reach: zeros, so every rank sends the same layout
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self._grads = [p.grad for p in params]
        flat = _flatten_dense_tensors(self._grads)
        handle = self._collectives.allreduce_async_(flat, process_set=self.process_set)
        self._handles = {"gradients": (handle, None)}

    def synchronize(self) -> None:
        """Wait for the sum and put it into the gradients."""
        for handle, _ in self._handles.values():
            summed = self._collectives.synchronize(handle)
            for grad, value in zip(self._grads, _unflatten_dense_tensors(summed, self._grads)):
                grad.copy_(value)
        self._handles, self._grads = {}, []

    @contextmanager
    def skip_synchronize(self):
        """``step()`` without waiting (after :meth:`synchronize`, as with Horovod and a GradScaler)."""
        self._synchronize = False
        try:
            yield
        finally:
            self._synchronize = True

    def step(self, closure=None):
        if self._synchronize:
            self.synchronize()
        return self.optimizer.step(closure)


def backend_for(device: str, collectives: str = "auto") -> str:
    """NCCL where the ranks train on GPUs, Gloo on CPUs; Gloo whenever ``collectives`` is ``gloo``
    (``--collectives gloo``): GPU tensors too, for several ranks on one GPU or GPU ranks beside
    CPU ranks, which NCCL cannot join (it takes one rank per GPU, and no CPU tensors)."""
    if collectives == "gloo":
        return "gloo"
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    return "nccl" if cuda else "gloo"


def start_torch(device: str = "auto", collectives: str = "auto") -> tuple:
    """Start torch.distributed in this rank (under torchrun, or under mpirun/srun from the MPI
    world: :func:`bno_hvd.processes.torchenv.init_process_group`), on :func:`backend_for`'s backend.
    Returns what :func:`bno_hvd.processes.world.init_world` makes the job's ``World`` of (``engine="torch"``):
    ``(collectives, rank, size, local_rank, control_comm, monitor_comm, notes, backend)``."""
    import torch.distributed as dist

    from bno_hvd.processes.torchcomm import TorchComm
    from bno_hvd.processes.torchenv import init_process_group

    notes = [n for n in [arrange_for_shared_cores()] if n]
    keep_freed_memory()  # no page faults on every update's activations (bno_hvd/processes/heap.py)
    backend = backend_for(device, collectives)
    launch = init_process_group("cpu:gloo,cuda:nccl" if backend == "nccl" else backend)  # CPU tensors too (evaluation)
    if launch == "mpi":
        from mpi4py import MPI

        control, monitor = MPI.COMM_WORLD.Dup(), MPI.COMM_WORLD.Dup()
    else:
        control, monitor = TorchComm(), None  # no MPI: the latency probe (MPI ping-pong) is off
    plane = "MPI" if launch == "mpi" else "Gloo (torch.distributed)"
    notes.append(f"--engine torch: gradients summed by torch.distributed over {backend}, the control plane on {plane}")
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        for note in notes:
            print(f"bno-hvd: note: {note}", file=sys.stderr, flush=True)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return TorchCollectives(control), rank, size, local_rank, control, monitor, notes, backend
