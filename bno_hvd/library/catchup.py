"""Catching up: a rank that sat an update out (no samples, no part in the allreduce) receives rank 0's
state before it computes again.

``balanced`` may give a rank 0 samples (:mod:`bno_hvd.allocation.balanced`, option ``sit_out``)
when its part of the allreduce costs the cluster more than the samples it computes are worth:
a rank at a few percent of a core holds every update back by its own slow sync. Several ranks
may sit out at once. For such an update the other ranks reduce their gradients over Horovod's
process set of the ranks that compute (made at the first update that needs it:
:class:`bno_hvd.processes.sitsets.SitOutSets`), so the update is the sample-weighted mean over
the samples that were computed, as always; a rank that sits out computes nothing, takes no
optimizer step, and waits only at the next rebalance.

Their model and optimizer state are then behind. Before it computes again, and before anything
that uses every rank's model (an evaluation, the final score), rank 0 (which never sits out)
sends each its own: parameters, buffers (BatchNorm's running statistics), optimizer state and the
GradScaler's state (its loss scale and growth tracker: a rank unscaling by another scale would
take another step), copied exactly, so the run stays
the one a single process would take on the same global batches (``tests/library/test_sit_out.py``).
"""

from __future__ import annotations

TAG = 7301  # the control communicator's point-to-point tag of a catch-up


class CatchUp:
    """Which ranks are behind, and what the gradient allreduce of an update runs over (every rank)."""

    def __init__(self, world, model, optimizer, scaler=None):
        self.world, self.model, self.optimizer, self.scaler = world, model, optimizer, scaler
        self.behind: set[int] = set()  # ranks that sat out since rank 0 last sent them its state

    def begin(self, sizes: list[int]) -> bool:
        """Before an update with these batch sizes (every rank knows them): catch up the ranks
        that compute again, and point the optimizer at the ranks that compute. True when this
        rank sent or received a state, or a new process set was made (Horovod initialised again:
        0.1 s, 36 s with ranks at 0.03 of a core): time that is not the step's."""
        moved = self.catch_up([r for r in self.behind if sizes[r] > 0])
        out = [r for r, b in enumerate(sizes) if b == 0]  # never rank 0 (valid_sizes)
        self.behind.update(out)
        # every rank, every update: the first update of a new set of ranks out makes its process set
        sets = self.world.sit_out_sets
        if sets is None:
            self.optimizer.process_set = self.world.hvd.global_process_set
            return moved
        makes = sets.makes
        self.optimizer.process_set = sets.without(out)
        return moved or sets.makes > makes

    @property
    def process_set(self):
        """The process set of this update's gradients (for the loss that rides with them)."""
        return self.optimizer.process_set

    def catch_up(self, ranks=None) -> bool:
        """Rank 0 sends its model, optimizer and GradScaler state to ``ranks`` (default: every rank behind);
        True when this rank sent or received one."""
        ranks = sorted(self.behind if ranks is None else ranks)
        comm, me = self.world.control_comm, self.world.rank
        for r in ranks:
            if me == 0:
                state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
                if self.scaler is not None:
                    state["scaler"] = self.scaler.state_dict()
                comm.send(state, dest=r, tag=TAG)
            elif me == r:
                state = comm.recv(source=0, tag=TAG)
                self.model.load_state_dict(state["model"])
                self.optimizer.load_state_dict(state["optimizer"])
                if self.scaler is not None:
                    self.scaler.load_state_dict(state["scaler"])
        self.behind.difference_update(ranks)
        return bool(ranks) and (me == 0 or me in ranks)
