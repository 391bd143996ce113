"""The process set (Horovod) or group (torch.distributed) of the ranks that compute an update,
looked up by the ranks that sit it out (0 samples: :mod:`bno_hvd.library.catchup`).

Any ranks but 0 may sit out at once, so the sets cannot all be made at start (there are
``2**(N-1) - 1``): each is made at the first update that needs it, collectively. Every rank knows
every update's split and asks for its set at the start of every update, so every rank makes the
same sets in the same order. Horovod makes them as dynamic process sets
(``hvd.init(process_sets="dynamic")``: its background loop then allgathers two ints per cycle
to agree on new sets; on Gloo, their ranks meet at a rendezvous store open while they are
made), torch.distributed as groups (``new_group``, called by every rank). Each
Horovod process set costs its ranks one negotiation per background cycle, so at most
:data:`LIVE` are kept: the least recently used one is removed, by every rank alike.

Usage::

    sets = world.sit_out_sets                 # None: a rank cannot sit out (one rank)
    optimizer.process_set = sets.without([r for r, b in enumerate(sizes) if b == 0])
"""

from __future__ import annotations

from collections import OrderedDict

from bno_hvd.common.errors import check_invariant

LIVE = 4  # process sets kept besides the global one (a split needs one; trials and returns a few)


class SitOutSets:
    """Rank subsets -> the process set (or group) of the other ranks, made when first asked for."""

    def __init__(self, size: int, everyone, make, remove, live: int = LIVE):
        self.size, self.everyone, self.live = int(size), everyone, int(live)
        self._make, self._remove = make, remove  # ranks -> a new set; a set -> None (both collective)
        self._made: OrderedDict[frozenset, object] = OrderedDict()

    @classmethod
    def horovod(cls, hvd, size: int, gloo_comm=None) -> SitOutSets:
        """After ``hvd.init(process_sets="dynamic")``. ``gloo_comm``: Horovod runs on Gloo, whose
        process sets meet at a rendezvous store, open again over this MPI communicator while one is
        made (:func:`bno_hvd.processes.gloo.rendezvous_open`)."""
        if gloo_comm is None:
            return cls(size, hvd.global_process_set, hvd.add_process_set, hvd.remove_process_set)
        from bno_hvd.processes.gloo import rendezvous_open

        def make(ranks):
            with rendezvous_open(gloo_comm):
                return hvd.add_process_set(ranks)

        return cls(size, hvd.global_process_set, make, hvd.remove_process_set)

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
        if key in self._made:
            self._made.move_to_end(key)
            return self._made[key]
        while len(self._made) >= self.live:
            self._remove(self._made.popitem(last=False)[1])
        made = self._made[key] = self._make([r for r in range(self.size) if r not in key])
        return made

    def __len__(self) -> int:
        """Sets made and kept."""
        return len(self._made)
