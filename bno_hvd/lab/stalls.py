"""Stalls: single updates of a run that took far longer than their neighbours, and what the logs
say held them up (pure: the run's records in, a list out).

A block of 20 updates at 70 ms loses half its rate to one update of 1.4 s, so one stall moves a
paired ratio of ``bench --rounds`` further than any strategy does. ``bench`` lists every stall
of the timed updates per strategy, so a reader can tell a strategy's loss from an event.

An update is a stall when rank 0's cycle (``weight_update_time``) is more than ``factor`` times
the median of its ``window`` neighbours on each side and at least ``min_seconds`` longer. Its
excess over that median is set against what the logs hold for the same update, and the largest
part names the cause (a garbage collection, a catch-up or a rebalance before a rank's slower step
or rank 0's unlogged time, which they are part of):

- ``gc``: seconds a rank spent in Python's garbage collector (``RankStep.gc``);
- ``rebalance``: rank 0's time in the control plane after the update;
- ``catch-up``: a rank's time sending (rank 0) or receiving the state of a rank that comes back
  after sitting out (``RankStep.catch_up``, :mod:`bno_hvd.library.catchup`);
- ``outside``: rank 0's cycle beyond all of its logged parts;
- ``step``: the slowest rank's gap and compute over its own neighbours' median (a throttled
  rank's quota ran out, a neighbour took its core);
- ``waits``: none of these explains half the excess (the allreduce or its waits).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bno_hvd.library.timing import RankStep
from bno_hvd.training.results import UpdateRecord


@dataclass
class Stall:
    update: int
    seconds: float  # rank 0's cycle
    median_seconds: float  # the median of its neighbours' cycles
    cause: str  # gc, rebalance, catch-up, outside, step, waits
    rank: int | None  # whose gc or step; None for the rest
    cause_seconds: float  # how much of the excess that cause accounts for
    returned: int | None = None  # a rank that sat out and computes again in this update
    # (whose gc, step or catch-up: the rank; rank 0 sends every catch-up and waits for the receiver)

    @property
    def excess(self) -> float:
        return self.seconds - self.median_seconds


def find_stalls(
    records: list[UpdateRecord],
    rank_steps: list[list[RankStep]],
    warmup: int = 0,
    factor: float = 2.0,
    min_seconds: float = 0.2,
    window: int = 10,
) -> list[Stall]:
    """The stalls among updates ``warmup..end`` (see the module's description)."""
    n = min([len(records)] + [len(s) for s in rank_steps])
    cycle = np.array([r.weight_update_time for r in records[:n]], dtype=float)
    local = np.array([[s.gap + s.compute for s in steps[:n]] for steps in rank_steps], dtype=float)
    out = []
    for i in range(warmup, n):
        around = np.concatenate([cycle[max(0, i - window) : i], cycle[i + 1 : i + 1 + window]])
        if around.size == 0:
            continue
        median = float(np.median(around))
        excess = cycle[i] - median
        if cycle[i] <= factor * median or excess < min_seconds:
            continue
        out.append(_explain(i, records, rank_steps, local, float(cycle[i]), median))
    return out


def _explain(i, records, rank_steps, local, seconds, median) -> Stall:
    excess = seconds - median
    lo, hi = max(0, i - 10), i + 11
    parts = []  # (seconds, cause, rank)
    for r, steps in enumerate(rank_steps):
        parts.append((steps[i].gc, "gc", r))
        parts.append((steps[i].catch_up, "catch-up", r))
        mine = np.concatenate([local[r, lo:i], local[r, i + 1 : hi]])
        if mine.size:
            parts.append((local[r, i] - float(np.median(mine)), "step", r))
    zero = rank_steps[0][i]
    parts.append((zero.rebalance, "rebalance", None))
    parts.append((seconds - zero.seconds - zero.catch_up, "outside", None))
    specific = [p for p in parts if p[1] in ("gc", "catch-up", "rebalance")]  # named before a rank's step
    explained, cause, rank = max(specific, key=lambda p: p[0])
    if explained < 0.5 * excess:
        explained, cause, rank = max(parts, key=lambda p: p[0])
    if explained < 0.5 * excess:
        explained, cause, rank = excess, "waits", None
    before = records[i - 1].batch_sizes if i > 0 else None
    back = [r for r, b in enumerate(records[i].batch_sizes) if b > 0 and before and before[r] == 0]
    return Stall(i, seconds, median, cause, rank, float(explained), back[0] if back else None)


def format_stalls(stalls: list[Stall], limit: int = 6) -> str:
    """One line: how many, their excess in all, and the largest few with their causes."""
    if not stalls:
        return "none"
    total = sum(s.excess for s in stalls)
    shown = sorted(stalls, key=lambda s: -s.excess)[:limit]
    parts = []
    for s in sorted(shown, key=lambda s: s.update):
        who = f" of rank {s.rank}" if s.rank is not None else ""
        back = f", rank {s.returned} back" if s.returned is not None else ""
        parts.append(
            f"u{s.update} {s.seconds * 1000:.0f} ms (median {s.median_seconds * 1000:.0f}; "
            f"{s.cause}{who} {s.cause_seconds * 1000:.0f} ms{back})"
        )
    more = f", +{len(stalls) - len(shown)} more" if len(stalls) > len(shown) else ""
    return f"{len(stalls)}, {total:.2f} s over their medians: " + ", ".join(parts) + more
