"""Which batch sizes each update uses, decided ``lag`` updates ahead (pure).

A DataLoader draws the indices of update t in its main process while update t - P is still
running (P = num_workers * prefetch_factor batches; P = 0 without workers). An allocation that
rank 0 decides after update u therefore cannot reach the next batch: it is used from update
u + D, with a lag D >= P + 1 that all ranks agree on at start-up (D = 1 without workers: the
next update, as a plain loop does).

Every rank holds the same plan: the updates done so far, and the sizes of every update that is
already decided. At the start of update s (``done == s``) the sizes of updates ``s .. s+D-1``
are final; asking for a later one is a lag that is too small for the loader
(:class:`LagError`), never a silent mismatch between ranks.

Usage::

    plan = AllocationPlan([8, 8, 8, 8], lag=3)
    plan.sizes(2)                 # [8, 8, 8, 8]: update 2 is within the lag
    plan.finish_update()          # update 0 done
    plan.decide([10, 6, 8, 8])    # used from update 1 + 3 - 1 = 3 on
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bno_hvd.common.errors import UsageError, check_invariant


class LagError(UsageError):
    """The batch of an update was asked for before its allocation was decided."""


@dataclass
class AllocationPlan:
    initial: list[int]
    lag: int = 1
    done: int = 0  # updates finished
    changes: list[tuple[int, list[int]]] = field(default_factory=list)  # (first update, sizes)

    def __post_init__(self) -> None:
        if self.lag < 1:
            raise UsageError(f"the allocation lag must be >= 1 update, got {self.lag}")
        if not self.changes:
            self.changes = [(self.done, [int(b) for b in self.initial])]

    @property
    def horizon(self) -> int:
        """First update whose sizes may still change: updates before it are final."""
        return self.done + self.lag

    def sizes(self, update: int) -> list[int]:
        """Every rank's batch of ``update`` (``done <= update < horizon``)."""
        if update < self.changes[0][0]:
            raise ValueError(f"update {update} is before the plan's first update {self.changes[0][0]}")
        if update >= self.horizon:
            raise LagError(
                f"the data loader asked for the batch of update {update} at update {self.done}, "
                f"but allocations are only decided {self.lag} update(s) ahead (lag D={self.lag}); "
                f"raise the lag to at least {update - self.done + 1} or prefetch fewer batches"
            )
        current = self.changes[0][1]
        for first, sizes in self.changes:
            if first > update:
                break
            current = sizes
        return list(current)

    def latest(self) -> list[int]:
        """The newest decision: what every update from the horizon on will use if nothing changes."""
        return list(self.changes[-1][1])

    def decide(self, sizes: list[int]) -> int:
        """Record rank 0's new allocation; returns the first update that uses it."""
        first = self.done + self.lag - 1
        sizes = [int(b) for b in sizes]
        if sizes != self.changes[-1][1]:
            check_invariant(first >= self.changes[-1][0], "allocation decisions are applied in order")
            if first == self.changes[-1][0]:
                self.changes[-1] = (first, sizes)
            else:
                self.changes.append((first, sizes))
        return first

    def finish_update(self) -> None:
        """Update ``done`` is finished; drop what no update will use again."""
        self.done += 1
        while len(self.changes) > 1 and self.changes[1][0] <= self.done:
            self.changes.pop(0)

    def raise_lag(self, lag: int) -> None:
        """A deeper loader: never lowered (decisions already made would come out of order)."""
        self.lag = max(self.lag, int(lag))

    def state_dict(self) -> dict:
        return {"lag": self.lag, "done": self.done, "changes": [[u, list(s)] for u, s in self.changes]}

    def load_state_dict(self, state: dict) -> None:
        self.lag = max(self.lag, int(state["lag"]))
        self.done = int(state["done"])
        self.changes = [(int(u), [int(b) for b in s]) for u, s in state["changes"]]
