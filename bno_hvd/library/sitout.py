"""Sitting out in a user's own script: what the drop-ins do for a rank the strategy gives 0 samples.

``balanced`` may give a rank other than 0 no samples, when its part of every update costs the
cluster more than its samples are worth (:mod:`bno_hvd.allocation.balanced`); a split given by hand
may have zeros too (``fixed`` 8,8,0,0). bno-hvd's own loop leaves such a rank out
(:mod:`bno_hvd.library.catchup`); in a ported script the drop-ins do, and the script's loop stays
as it was:

- :class:`bno_hvd.DataLoader` never hands the rank the empty batch: it ends that update for the
  rank itself (no forward, no backward, no optimizer step; the rank waits only at the next
  rebalance) and goes on to the rank's next batch;
- the ranks that compute reduce their gradients, and exact BatchNorm its statistics, over a group of
  their own (:meth:`SitOut.allreduce_`): Horovod's allreduce is set aside for that update
  (:func:`bno_hvd.DistributedOptimizer` sums over an MPI communicator of the computing ranks,
  ``MPI_Comm_create_group``: no Horovod restart); :func:`bno_hvd.DistributedDataParallel`'s hook
  all-reduces over a torch.distributed group of them (``new_group``);
- before a rank computes again, and before the script's evaluation (the end of each epoch's ``for``),
  rank 0 sends it what moved meanwhile: the parameters, the models' buffers (BatchNorm's running
  statistics) and the optimizers' state (momentum, Adam's moments), copied exactly.

So the update stays the sample-weighted mean over the samples computed, exactly one process's
(``tests/library/test_dropin_sitout.py``). What travels: the optimizer the drop-in wraps (Horovod)
or every optimizer that steps the DDP model's parameters (seen at its first step), and every model
given to :func:`bno_hvd.exact` / ``exact_batchnorm`` or wrapped by the DDP drop-in, and the
GradScaler that unscales such an optimizer (seen at its ``unscale_``, which ``scaler.step`` calls
too): a rank back unscales by rank 0's scale, as one process would.
"""

from __future__ import annotations

import weakref

import torch

from bno_hvd.processes.collectives import sleep_until
from bno_hvd.processes.sitsets import SitOutSets

TAG = 7302  # the control communicator's point-to-point tag of a drop-in's catch-up


class EpochStopped(Exception):
    """Rank 0 left the epoch's ``for`` early while this rank sat out: its ``for`` ends too."""


class SitOut:
    """One balancer's ranks out: who is behind, the group of this update's computing ranks, and
    what a rank back receives. ``groups``: ranks out -> the group of the others (a
    :class:`~bno_hvd.processes.sitsets.SitOutSets`); ``reduce(tensor, group)`` sums in place over it.

    A rank out does not run ahead: at each update it sits out it waits (asleep) for rank 0's word
    that the update is under way, ``go``; ``back`` brings rank 0's state to a rank that computes
    again; ``stop`` (with the state) ends its epoch's ``for`` where rank 0's ended early (a script's
    ``break``), so that no rank is left waiting for the others."""

    def __init__(self, balancer, groups: SitOutSets, reduce):
        self.balancer, self.groups, self.reduce = balancer, groups, reduce
        self.group = None  # this update's group of the ranks that compute; None: every rank computes
        self.behind: set[int] = set()  # ranks that sat out since rank 0 last sent them its state
        self.optimizers: list = []  # what travels besides the balancer's models (see the module doc)
        self.scalers: list = []  # GradScalers of those optimizers (seen at their unscale_)
        self.pending: dict = {"optimizers": [], "scalers": []}  # states received before this rank saw its own
        _LIVE.add(self)
        _see_scalers()

    def begin(self, sizes: list[int]) -> None:
        """Before the update with these sizes (every rank, every update, in order): rank 0's word
        to the ranks out and its state to the ranks back, then this update's group.
        :class:`EpochStopped` on a rank waiting for a word when rank 0 ended the epoch early."""
        out = [r for r, b in enumerate(sizes) if b == 0]  # never rank 0 (valid_sizes)
        back = sorted(r for r in self.behind if sizes[r] > 0)
        me = self.balancer.rank
        if me == 0:
            for r in back:
                self._send(("back", self.state()), r)
            for r in out:
                self._send(("go", None), r)
        elif me in out or me in back:
            word, state = self._receive()
            if state is not None:
                self.load(state)
            if word == "stop":
                self.behind.clear()
                raise EpochStopped
        self.behind.difference_update(back)
        self.behind.update(out)
        self.group = self.groups.without(out) if out else None

    def stop(self) -> None:
        """Rank 0's epoch ``for`` ended before its end: the ranks that wait for its word (those
        behind: they computed none of the updates since they went out) get its state and end theirs."""
        if self.balancer.rank == 0:
            for r in sorted(self.behind):
                self._send(("stop", self.state()), r)
        self.behind.clear()

    def allreduce_(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` in place over this update's computing ranks (call only where some rank is out)."""
        self.reduce(tensor, self.group)

    def catch_up(self) -> None:
        """At the end of an epoch (every rank): rank 0 sends its state to every rank behind."""
        me = self.balancer.rank
        for r in sorted(self.behind):
            if me == 0:
                self._send(("back", self.state()), r)
            elif me == r:
                self.load(self._receive()[1])
        self.behind.clear()

    def note_optimizer(self, optimizer) -> None:
        """An optimizer whose state travels (its first step; the Horovod drop-in's at once)."""
        self._note("optimizers", optimizer)

    def note_scaler(self, scaler, optimizer) -> None:
        """A GradScaler unscales ``optimizer``'s gradients: its scale travels if the optimizer's does."""
        if any(o is optimizer for o in self.optimizers):
            self._note("scalers", scaler)

    def _note(self, kind: str, thing) -> None:
        kept = getattr(self, kind)
        if all(t is not thing for t in kept):
            kept.append(thing)
            if self.pending[kind]:
                thing.load_state_dict(self.pending[kind].pop(0))

    def state(self) -> dict:
        params = [p for o in self.optimizers for g in o.param_groups for p in g["params"]]
        return {
            "models": [m.state_dict() for m in self.balancer.models],
            "params": [p.detach().cpu() for p in params],
            "optimizers": [o.state_dict() for o in self.optimizers],
            "scalers": [s.state_dict() for s in self.scalers],
        }

    def load(self, state: dict) -> None:
        with torch.no_grad():
            for model, values in zip(self.balancer.models, state["models"]):
                model.load_state_dict(values)
            params = [p for o in self.optimizers for g in o.param_groups for p in g["params"]]
            for p, value in zip(params, state["params"]):
                p.copy_(value)
        for kind in ("optimizers", "scalers"):
            kept = getattr(self, kind)
            for thing, values in zip(kept, state[kind]):
                thing.load_state_dict(values)
            self.pending[kind] = list(state[kind][len(kept) :])

    def _send(self, message, rank: int) -> None:
        self.balancer.control.plane.comm.send(message, dest=rank, tag=TAG)

    def _receive(self):
        comm = self.balancer.control.plane.comm
        probe = getattr(comm, "iprobe", None)
        if probe is not None:  # MPI: asleep until it is there (a rank out may wait a while)
            sleep_until([lambda: probe(source=0, tag=TAG)])
        return comm.recv(source=0, tag=TAG)


_LIVE: weakref.WeakSet = weakref.WeakSet()  # every SitOut of this process


def _see_scalers() -> None:
    """From the first SitOut on, ``GradScaler.unscale_`` (which ``scaler.step`` calls too) tells every
    SitOut which scaler unscales which optimizer; it changes nothing else. The drop-ins are not
    handed the script's scaler, and a rank back from sitting out must unscale by rank 0's scale."""
    cls = torch.amp.GradScaler
    if getattr(cls.unscale_, "_bno_seen", False):
        return
    original = cls.unscale_

    def unscale_(self, optimizer):
        for sit_out in list(_LIVE):
            sit_out.note_scaler(self, optimizer)
        return original(self, optimizer)

    unscale_._bno_seen = True
    cls.unscale_ = unscale_


def mpi_groups(comm) -> SitOutSets:
    """Ranks out -> an MPI communicator of the others, made by them alone (``MPI_Comm_create_group``;
    None on a rank out). ``comm``: the balancer's, duplicated for gradients only."""
    me = comm.Get_rank()

    def make(ranks):
        return comm.Create_group(comm.Get_group().Incl(ranks)) if me in ranks else None

    def remove(sub):
        if sub is not None:
            sub.Free()

    return SitOutSets(comm.Get_size(), None, make, remove)


def mpi_sum(tensor: torch.Tensor, group) -> None:
    """``tensor`` summed in place over the MPI communicator ``group``, waiting with sleeps (a
    rank under a CPU limit would spin its quota away in MPI's wait)."""
    from mpi4py import MPI

    host = tensor.detach().cpu().contiguous() if tensor.device.type != "cpu" or not tensor.is_contiguous() else tensor
    request = group.Iallreduce(MPI.IN_PLACE, host.detach().numpy(), op=MPI.SUM)
    sleep_until([request.Test])
    if host is not tensor:
        tensor.copy_(host)


def torch_sum(tensor: torch.Tensor, group) -> None:
    """``tensor`` summed in place over the torch.distributed ``group``."""
    import torch.distributed as dist

    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
