"""The control plane's communicator where there is no MPI: torch.distributed object collectives on
a Gloo group (a job launched by ``torchrun``).

The control plane talks to one small interface, :class:`ControlComm`: the handful of mpi4py
calls the Balancer, its controller, checkpoints and the training loop make on the communicator
reserved for it. An mpi4py communicator (``MPI.COMM_WORLD.Dup()``) *is* the first
implementation, unchanged, so every MPI job behaves exactly as it always has. :class:`TorchComm`
is the second: the same calls over ``torch.distributed`` on a Gloo group of its own (Gloo even
when the gradients go over NCCL: control messages are small pickled Python objects, and Gloo's
TCP waits sleep in the kernel). Nothing above the communicator knows which one it holds.

Usage (every rank, after ``torch.distributed.init_process_group``)::

    comm = TorchComm()                       # its own Gloo group of every rank
    sizes = comm.bcast(sizes if comm.Get_rank() == 0 else None, root=0)
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["ControlComm", "TorchComm"]


class ControlComm(Protocol):
    """What the control plane calls on its communicator (mpi4py's names and semantics; ``root``,
    ``dest`` and ``source`` are ranks of the communicator). ``mpi4py.MPI.Comm`` satisfies it."""

    def Get_rank(self) -> int: ...  # noqa: N802 - mpi4py's names, so an MPI communicator is one
    def Get_size(self) -> int: ...  # noqa: N802
    def gather(self, obj: Any, root: int = 0) -> list | None: ...
    def bcast(self, obj: Any, root: int = 0) -> Any: ...
    def allgather(self, obj: Any) -> list: ...
    def scatter(self, objs: list | None, root: int = 0) -> Any: ...
    def send(self, obj: Any, dest: int, tag: int = 0) -> None: ...
    def recv(self, source: int, tag: int = 0) -> Any: ...
    def Barrier(self) -> None: ...  # noqa: N802
    def Ibarrier(self) -> Any: ...  # noqa: N802 - a request whose Test() is True once every rank arrived
    def Dup(self) -> ControlComm: ...  # noqa: N802 - collective: the same ranks, messages kept apart


class TorchComm:
    """:class:`ControlComm` over ``torch.distributed`` on a Gloo group of every rank.

    Collective to build (``new_group`` is collective over the whole job); ``group``: an existing
    Gloo group of every rank, else a new one that waits as long as the default group (torch's
    ``new_group`` would wait 30 minutes: ``--elastic-timeout`` is every collective's limit, a
    survivor's too). Messages on different TorchComms never mix (each
    is its own group), as with ``Dup()`` in MPI. ``tag`` is accepted and ignored: within one
    communicator messages between two ranks arrive in order, which is all the control plane uses."""

    def __init__(self, group=None):
        import torch.distributed as dist

        self._dist = dist
        self.group = dist.new_group(backend="gloo", timeout=_default_timeout()) if group is None else group
        self._rank = dist.get_rank(self.group)
        self._size = dist.get_world_size(self.group)
        if self._size != dist.get_world_size():
            raise ValueError("TorchComm needs a group of every rank (its ranks are the job's ranks)")

    def Get_rank(self) -> int:  # noqa: N802
        return self._rank

    def Get_size(self) -> int:  # noqa: N802
        return self._size

    def gather(self, obj, root: int = 0):
        out = [None] * self._size if self._rank == root else None
        self._dist.gather_object(obj, out, dst=root, group=self.group)
        return out

    def bcast(self, obj, root: int = 0):
        box = [obj]
        self._dist.broadcast_object_list(box, src=root, group=self.group)
        return box[0]

    def allgather(self, obj) -> list:
        out = [None] * self._size
        self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def scatter(self, objs, root: int = 0):
        box = [None]
        self._dist.scatter_object_list(box, list(objs) if self._rank == root else None, src=root, group=self.group)
        return box[0]

    def send(self, obj, dest: int, tag: int = 0) -> None:
        self._dist.send_object_list([obj], dst=dest, group=self.group)

    def recv(self, source: int, tag: int = 0):
        box = [None]
        self._dist.recv_object_list(box, src=source, group=self.group)
        return box[0]

    def Barrier(self) -> None:  # noqa: N802
        self._dist.barrier(group=self.group)

    def Ibarrier(self):  # noqa: N802
        return _Request(self._dist.barrier(group=self.group, async_op=True))

    def Dup(self) -> TorchComm:  # noqa: N802
        return TorchComm()

    def close(self) -> None:
        """Drop this communicator's group (not collective): once nothing else holds it, its Gloo
        connections close, and a peer still waiting on one fails at once instead of at its timeout
        (an elastic generation that failed). The communicator is not used after."""
        self.group = None


def _default_timeout():
    """The default group's timeout (``init_process_group(timeout=)``), None where torch hides it."""
    import torch
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError, ValueError):  # a torch that keeps it elsewhere: torch's default
        return None


class _Request:
    """An asynchronous barrier as mpi4py shows it: ``Test()`` is True once it completed."""

    def __init__(self, work):
        self.work = work

    def Test(self) -> bool:  # noqa: N802
        if not self.work.is_completed():
            return False
        self.work.wait()  # raises here if the barrier failed
        return True
