"""One rank's side of the control plane: what it reports at a rebalance, and the plan of allocations
every rank holds.

At a rebalance each rank sends rank 0 a :class:`~bno_hvd.library.control.plane.RankReport` (its
recent steps, sync times, memory, latency row, CPU limit); rank 0 runs the strategy and broadcasts
the sizes (:class:`~bno_hvd.library.control.plane.ControlPlane`); every rank records them in the
same :class:`~bno_hvd.allocation.plan.AllocationPlan`, used ``lag`` updates later. The plan and
rank 0's strategy are the state a checkpoint keeps of the control plane.

Usage (what :class:`bno_hvd.library.balancer.Balancer` does)::

    control = Controller(comm, strategy, lag=None)
    result = control.rebalance(report, update)      # collective
    control.plan.sizes(update)
"""

from __future__ import annotations

from bno_hvd.allocation.plan import AllocationPlan
from bno_hvd.allocation.strategy import valid_sizes
from bno_hvd.common.errors import UsageError
from bno_hvd.library.control.plane import ControlPlane, RebalanceResult


class Controller:
    """The control plane as one rank sees it. ``comm`` is reserved for it; ``strategy`` is used on
    rank 0 (every rank passes the same kind); ``lag`` fixes the allocation lag (None: the smallest
    that suits the loaders, agreed by :meth:`agree_lag`)."""

    def __init__(self, comm, strategy, lag: int | None = None):
        self.plane = ControlPlane(comm)
        self.rank, self.size = self.plane.rank, self.plane.size
        self.strategy = strategy
        self.fixed_lag = lag
        self.plan = AllocationPlan(self.plane.decide_on_root(self._initial), lag=lag or 1)

    def _initial(self) -> list[int]:
        """Rank 0's strategy's first allocation, for the world it has to fit (run on rank 0)."""
        n = getattr(self.strategy, "n_ranks", self.size)
        if n != self.size:
            raise UsageError(
                f"the strategy was made for {n} ranks but the job has {self.size}; "
                f"make it with make_strategy(name, {self.size}, batch_size) (hvd.size() ranks)"
            )
        sizes = [int(b) for b in self.strategy.initial()]
        sit_out_ok = getattr(self.strategy, "sit_out_ok", False)
        if not valid_sizes(sizes, self.size, sit_out_ok):
            shown = sizes if len(sizes) <= 16 else f"{len(sizes)} sizes"
            low = ">= 1 (rank 0) and >= 0 (a rank that sits out)" if sit_out_ok else ">= 1 (no rank may sit out here)"
            raise UsageError(f"the strategy's initial allocation must be {self.size} batch sizes {low}, got {shown}")
        return sizes

    def agree_lag(self, depth: int) -> int:
        """Collective: the lag every rank uses for loaders that read ``depth`` batches ahead."""
        deepest = max(self.plane.comm.allgather(int(depth)))
        needed = deepest + 1
        if self.fixed_lag is not None and self.fixed_lag < needed:
            raise UsageError(
                f"allocation lag {self.fixed_lag} is too small: a loader reads {deepest} batches "
                f"ahead (num_workers x prefetch_factor), so allocations need a lag of at least "
                f"{needed}; raise it or leave it unset"
            )
        self.plan.raise_lag(needed)
        return self.plan.lag

    def rebalance(self, report, update: int) -> RebalanceResult:
        """Collective: gather, allocate on rank 0, broadcast; used from update ``done + lag - 1``."""
        result = self.plane.rebalance(self.strategy, report, self.plan.latest(), update)
        self.plan.decide(result.batch_sizes)
        return result

    def state_dict(self) -> dict:
        return {
            "plan": self.plan.state_dict(),
            "strategy": self.strategy.state_dict() if self.rank == 0 else None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.plan.load_state_dict(state["plan"])
        if self.rank == 0 and state.get("strategy") is not None:
            self.strategy.load_state_dict(state["strategy"])
