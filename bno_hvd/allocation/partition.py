"""The length-aware sampler's cut: a global batch of sequences split by shares of work (pure).

The strategies decide each rank's *share* of an update's work (:mod:`bno_hvd.allocation.costmodel`);
this module turns the shares into sequences. The global batch (the next sequences of the stream,
every sequence once per epoch) is sorted by work (stream order among equals) and cut into
contiguous runs, one per rank: consecutive lengths pad little inside a rank's micro-batches.
The ranks with the smallest shares take the shortest sequences, where the grain is finest. The
cut minimises the largest overload ``work_i / target_i`` (``target_i`` = the rank's share of the
batch's work), each rank keeping at least one sequence; with shares from ``balanced`` that is
"predicted finish times equal" up to one sequence's grain.

Usage::

    counts = split_by_shares([10, 10, 20, 40, 80, 300], [1, 1, 1, 3])   # sequences per rank
"""

from __future__ import annotations

import numpy as np

from bno_hvd.common.errors import check_invariant


def rank_order(shares) -> list[int]:
    """Ranks from the smallest share to the largest (by rank among equals): who takes the shortest."""
    return sorted(range(len(shares)), key=lambda r: (shares[r], r))


def split_by_shares(work_sorted, shares) -> list[int]:
    """Sequences per rank (in rank order) for items of ascending ``work_sorted``; see the module doc."""
    w = np.asarray(work_sorted, dtype=float)
    shares = [float(s) for s in shares]
    n, k = len(w), len(shares)
    if n < k:
        raise ValueError(f"a global batch of {n} sequences cannot give each of {k} ranks one")
    if any(s <= 0 for s in shares):
        raise ValueError(f"shares must be positive, got {shares}")
    order = rank_order(shares)
    total = float(w.sum())
    targets = [shares[r] / sum(shares) * total for r in order]
    cum = np.concatenate([[0.0], np.cumsum(w)])

    def cut(load: float) -> list[int] | None:
        """Counts in ``order`` when every rank but the last takes what fits under ``load`` x its target."""
        counts, start = [], 0
        for i, target in enumerate(targets[:-1]):
            room = n - start - (k - 1 - i)  # leave one sequence for every later rank
            take = int(np.searchsorted(cum, cum[start] + load * target, side="right")) - 1 - start
            take = min(max(take, 1), room)
            counts.append(take)
            start += take
        counts.append(n - start)
        return counts if cum[n] - cum[start] <= load * targets[-1] * (1 + 1e-12) else None

    lo, hi = 0.0, max(1.0, total / max(min(targets), 1e-300))
    while cut(hi) is None:
        hi *= 2
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if cut(mid) is None:
            lo = mid
        else:
            hi = mid
    counts_in_order = cut(hi)
    out = [0] * k
    for r, c in zip(order, counts_in_order):
        out[r] = c
    check_invariant(sum(out) == n and min(out) >= 1, f"split_by_shares gave {out} for {n} samples")
    return out


def rank_range(counts, shares, rank: int) -> tuple[int, int]:
    """``(start, stop)`` of ``rank``'s run in the sorted global batch."""
    start = 0
    for r in rank_order(shares):
        if r == rank:
            return start, start + int(counts[r])
        start += int(counts[r])
    raise ValueError(f"no rank {rank}")
