"""Which pairs of ranks ping each other, and when (pure).

A round-robin tournament (circle method) gives N-1 rounds (N even; N odd adds a bye) in
which every rank meets exactly one partner, so all pairs are covered with no rank busy
twice in a round. For large N the probe samples ``max_rounds`` of those rounds per refresh
(rotating through them), so a rank's cost per refresh stays constant instead of growing
with N; unmeasured pairs are filled in by :func:`complete_matrix`.
"""

from __future__ import annotations

import numpy as np


def tournament_rounds(n: int) -> list[list[tuple[int, int]]]:
    """All pairs ``(i, j)``, ``i < j``, grouped into rounds of disjoint pairs."""
    if n < 2:
        return []
    players = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for k in range(m // 2):
            a, b = players[k], players[m - 1 - k]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(pairs)
        players = [players[0], players[-1]] + players[1:-1]
    return rounds


def rounds_for_refresh(n: int, refresh: int, max_rounds: int | None) -> list[list[tuple[int, int]]]:
    """The rounds probed at refresh number ``refresh``: all of them, or a rotating window."""
    rounds = tournament_rounds(n)
    if max_rounds is None or max_rounds >= len(rounds):
        return rounds
    start = (refresh * max_rounds) % len(rounds)
    return [rounds[(start + k) % len(rounds)] for k in range(max_rounds)]


def partner_in(round_pairs: list[tuple[int, int]], rank: int) -> int | None:
    for i, j in round_pairs:
        if rank in (i, j):
            return j if rank == i else i
    return None


def complete_matrix(rows: np.ndarray) -> np.ndarray:
    """Symmetric NxN latency matrix from rows with NaN where a pair was not measured.

    Measured both ways: the mean; one way: that value; never: the median of all measured
    pairs (the best guess of a typical link). The diagonal is 0. Vectorised: N = 4096 in
    well under a second.
    """
    m = np.array(rows, dtype=float)
    np.fill_diagonal(m, np.nan)
    seen = ~np.isnan(m)
    values = m[seen]
    fill = float(np.median(values)) if values.size else 0.0
    np.nan_to_num(m, copy=False, nan=0.0)
    count = seen.astype(np.float32)
    count += count.T
    out = m + m.T
    np.divide(out, count, out=out, where=count > 0)
    out[count == 0] = fill
    np.fill_diagonal(out, 0.0)
    return out
