"""The process set (Horovod) or group (torch.distributed) of the ranks that compute an update,
looked up by the ranks that sit it out (0 samples: :mod:`bno_hvd.library.catchup`).

Any ranks but 0 may sit out at once, so the sets cannot all be made at start (there are
``2**(N-1) - 1``): each is made at the first update that needs it, collectively (Horovod's sets
of one rank out at start). Every rank knows every update's split and asks for its set at the start of
every update, so every rank makes the same sets in the same order. torch.distributed makes them as
groups (``new_group``, called by every rank). Horovod's sets are static: given to ``hvd.init``, so
a new one means initialising Horovod again with it (a barrier, ``hvd.shutdown``, ``hvd.init``: 0.1-1 s,
once per new set; on Gloo its ranks meet at a rendezvous store open meanwhile). Its dynamic process sets
would avoid that but cost every allreduce: its background loop then agrees on new sets every cycle
(4 ranks, a 0.2 M-parameter gradient: 26 ms per allreduce on Gloo against 8, 2.3 against 1.3 on
MPI). At most :data:`LIVE` sets of several ranks are kept: the least recently used one is removed,
by every rank alike.

Usage::

    sets = world.sit_out_sets                 # None: a rank cannot sit out (one rank)
    optimizer.process_set = sets.without([r for r, b in enumerate(sizes) if b == 0])
"""

from __future__ import annotations

from collections import OrderedDict

from bno_hvd.common.errors import check_invariant

LIVE = 2  # sets of several ranks kept (the split's and one more); each costs a negotiation per cycle
FIXED_UP_TO = 64  # ranks up to which every set of one rank out is made at start (one communicator each)


class SitOutSets:
    """Rank subsets -> the process set (or group) of the other ranks, made when first asked for."""

    def __init__(self, size: int, everyone, make, remove, live: int = LIVE, fixed: dict | None = None):
        self.size, self.everyone, self.live = int(size), everyone, int(live)
        self._make, self._remove = make, remove  # ranks -> a new set; a set -> None (both collective)
        self.fixed = fixed or {}  # ranks out -> a set made at start, never removed
        self._made: OrderedDict[frozenset, object] = OrderedDict()
        self.makes = 0  # sets made so far (Horovod: each one an hvd.init; the loop keeps that time out of a step)

    @classmethod
    def horovod(cls, hvd, size: int, start, barrier) -> SitOutSets:
        """Before ``hvd.init``: pass :meth:`static` to it. ``start(process_sets)`` initialises
        Horovod with these static sets (collective; on Gloo with a rendezvous store open);
        ``barrier()`` waits for every rank (an MPI barrier on a communicator of its own)."""
        others = [[i for i in range(size) if i != r] for r in range(1, size if size <= FIXED_UP_TO else 1)]
        sets = cls(size, hvd.global_process_set, None, lambda _: None, fixed={})
        sets.fixed = {frozenset(set(range(size)) - set(o)): hvd.ProcessSet(o) for o in others}

        def make(ranks):
            made = hvd.ProcessSet(ranks)
            # a rank out runs ahead to here while the others still reduce the update before: shut
            # down under them, their allreduce found its process set gone (seen under load, when
            # a second rank was tried out beside one already out). After the barrier none is in flight.
            barrier()
            hvd.shutdown()
            start(sets.static() + [made])
            return made

        sets._make = make
        return sets

    def static(self) -> list:
        """Every set made and kept (Horovod: what ``hvd.init`` is given)."""
        return list(self.fixed.values()) + list(self._made.values())

    @classmethod
    def torch(cls, size: int) -> SitOutSets:
        """After ``torch.distributed.init_process_group``."""
        import torch.distributed as dist

        return cls(size, None, dist.new_group, dist.destroy_process_group)

    def without(self, out) -> object:
        """The set of every rank not in ``out`` (the global set when ``out`` is empty). Collective
        when the set is not made yet: call it on every rank alike, at every update
        (:meth:`bno_hvd.library.catchup.CatchUp.begin` does), and later calls of that update
        (BatchNorm's, the loss's) find it made."""
        key = frozenset(int(r) for r in out)
        if not key:
            return self.everyone
        check_invariant(0 not in key and len(key) < self.size, f"ranks {sorted(key)} cannot sit out")
        if key in self.fixed:
            return self.fixed[key]
        if key in self._made:
            self._made.move_to_end(key)
            return self._made[key]
        while len(self._made) >= self.live:
            self._remove(self._made.popitem(last=False)[1])
        made = self._made[key] = self._make([r for r in range(self.size) if r not in key])
        self.makes += 1
        return made

    def __len__(self) -> int:
        """Sets of several ranks made and kept."""
        return len(self._made)
