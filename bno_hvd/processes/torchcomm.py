"""The control plane's communicator where there is no MPI: pickled messages over torch.distributed
collectives on a Gloo group (a job launched by ``torchrun``).

The control plane talks to one small interface, :class:`ControlComm`: the handful of mpi4py
calls the Balancer, its controller, checkpoints and the training loop make on the communicator
reserved for it. An mpi4py communicator (``MPI.COMM_WORLD.Dup()``) *is* the first
implementation, unchanged, so every MPI job behaves exactly as it always has. :class:`TorchComm`
is the second: the same calls over ``torch.distributed`` on a Gloo group of its own (Gloo even
when the gradients go over NCCL: control messages are small pickled Python objects, and Gloo's
TCP waits sleep in the kernel). ``gather`` and ``bcast``, a rebalance's two, send each message in
one fixed-size slot (:data:`SLOT`); the others use torch's object collectives. Nothing above the
communicator knows which one it holds.

Usage (every rank, after ``torch.distributed.init_process_group``)::

    comm = TorchComm()                       # its own Gloo group of every rank
    sizes = comm.bcast(sizes if comm.Get_rank() == 0 else None, root=0)
"""

from __future__ import annotations

import pickle
import struct
from typing import Any, Protocol

import torch

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
        self.group = gloo_group(_default_timeout()) if group is None else group
        self._rank = dist.get_rank(self.group)
        self._size = dist.get_world_size(self.group)
        if self._size != dist.get_world_size():
            raise ValueError("TorchComm needs a group of every rank (its ranks are the job's ranks)")

    def Get_rank(self) -> int:  # noqa: N802
        return self._rank

    def Get_size(self) -> int:  # noqa: N802
        return self._size

    def gather(self, obj, root: int = 0):
        slot, rest = _pack(obj)
        slots = [torch.empty_like(slot) for _ in range(self._size)] if self._rank == root else None
        self._dist.gather(slot, slots, dst=root, group=self.group)
        if self._rank != root:
            if rest:  # longer than its slot: the rest goes to the root apart
                self._dist.send(_bytes_tensor(rest), dst=root, group=self.group)
            return None
        out = []
        for r, got in enumerate(slots):
            more = _length(got) - len(_first(got))
            if r == root or not more:
                out.append(_unpack(got, rest if r == root else b""))
                continue
            tail = torch.empty(more, dtype=torch.uint8)
            self._dist.recv(tail, src=r, group=self.group)
            out.append(_unpack(got, tail.numpy().tobytes()))
        return out

    def bcast(self, obj, root: int = 0):
        slot, rest = _pack(obj) if self._rank == root else (torch.empty(SLOT, dtype=torch.uint8), b"")
        self._dist.broadcast(slot, src=root, group=self.group)
        more = _length(slot) - len(_first(slot))
        if more:  # longer than the slot: the rest in a second broadcast
            tail = _bytes_tensor(rest) if self._rank == root else torch.empty(more, dtype=torch.uint8)
            self._dist.broadcast(tail, src=root, group=self.group)
            rest = tail.numpy().tobytes()
        return obj if self._rank == root else _unpack(slot, rest)

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


# What one rank's message takes in a gather or a broadcast: an 8-byte length, then the start of its
# pickle. One fixed-size collective where torch's object collectives make two (the sizes first);
# a longer message sends the rest apart (a report of a rebalance: about 1.1 KB on 4 ranks, 3.4 KB on
# 256). On 4 ranks on 2 cores a report's gather and the decision's broadcast cost rank 0 1.7 ms of
# CPU instead of 5.3 (torch's gather_object and broadcast_object_list; 2026-11-30).
SLOT = 4096
_HEAD = struct.Struct("<q")


def _pack(obj) -> tuple:
    """``obj`` pickled: its slot (uint8, :data:`SLOT` bytes) and the bytes that did not fit."""
    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    first = data[: SLOT - _HEAD.size]
    slot = torch.zeros(SLOT, dtype=torch.uint8)
    slot[: _HEAD.size + len(first)] = _bytes_tensor(_HEAD.pack(len(data)) + first)
    return slot, data[len(first) :]


def _length(slot) -> int:
    return _HEAD.unpack(slot[: _HEAD.size].numpy().tobytes())[0]


def _first(slot) -> bytes:
    return slot[_HEAD.size : _HEAD.size + _length(slot)].numpy().tobytes()


def _unpack(slot, rest: bytes):
    return pickle.loads(_first(slot) + rest)


def _bytes_tensor(data: bytes):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


# Gloo gives up connecting to a peer that died or stopped in the middle of the handshake only after
# five times the group's timeout (torch 2.13: 25 s at 5 s, with a stopped peer). A
# member of an elastic generation stuck there missed the next generation's forming (the others
# wait 3 x --elastic-timeout): the members that arrived went on without it, once without any
# worker that held the training state (the DDP script's fault matrix, seed 13, in CI). So the groups
# of an elastic generation form within 1/5 of the timeout, which their collectives then keep.
CONNECT_TRIES = 5
_elastic = [False]  # this process forms elastic generations (bno_hvd.processes.membership)


def connect_fast() -> None:
    """This process's groups from now on connect within a fifth of their timeout (an elastic worker)."""
    _elastic[0] = True


def connect_timeout(timeout):
    """What a group whose collectives wait ``timeout`` connects within: a fifth of it in an elastic
    worker (:func:`connect_fast`), else all of it."""
    import torch.distributed as dist

    if not _elastic[0] or timeout is None or not hasattr(dist.distributed_c10d, "_set_pg_timeout"):
        return timeout
    return timeout / CONNECT_TRIES


def keep_timeout(connect, timeout, group=None) -> None:
    """A group made with ``connect_timeout(timeout)``: its collectives wait all of ``timeout``."""
    import torch.distributed as dist

    if connect != timeout:
        dist.distributed_c10d._set_pg_timeout(timeout, group)


def gloo_group(timeout):
    """A new Gloo group of every rank (collective) whose collectives wait ``timeout``."""
    import torch.distributed as dist

    connect = connect_timeout(timeout)
    group = dist.new_group(backend="gloo", timeout=connect)
    keep_timeout(connect, timeout, group)
    return group


def _default_timeout():
    """The default group's timeout (``init_process_group(timeout=)``), None where torch hides it."""
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
