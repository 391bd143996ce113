"""What ``balanced`` adds to each rank's fixed cost besides its compute: the time it costs the
others when it arrives last at the allreduce (:func:`arrival_penalties`), its sync phase paid at
its CPU limit's rate (:func:`throttle_offsets`, with :func:`limit_changed` telling when that
limit changed), and its links' latency (:func:`latency_offsets`). Each is in seconds, relative to
the rank that pays least, so a uniform cluster gets nothing. The model they enter is described
in :mod:`bno_hvd.allocation.balanced`."""

from __future__ import annotations

import math

import numpy as np


def arrival_penalties(sync_samples, sigmas: float = 2.0) -> np.ndarray:
    """Seconds each rank adds to the allreduce when it is the last to arrive (NaN: not seen often
    enough to tell), from every rank's recent ``(update, sync seconds)``.

    In an update every rank waits in the allreduce until the last one arrives, and the allreduce
    then ends on all ranks together, so the shortest sync time of the update is the allreduce
    itself and belongs to the rank that arrived last. A rank whose own part of the allreduce is
    slow (a CPU quota it already spent on compute) makes that shortest time longer whenever it is
    the last: the mean of those updates minus the mean of the others is its penalty. Giving
    the rank that much less compute lets it arrive earlier. Only durations enter, each timed on
    its own rank, so no common clock is needed.

    The penalty is that difference less ``sigmas`` standard errors (Welch), and 0 below that:
    under CPU quotas the allreduce jitters by several ms (a quota period hit or not), and on
    equal ranks a "penalty" of noise moved samples back and forth (measured: 0.88x equal on four
    ranks at 0.5 of a core). :class:`EqualFinishStrategy` keeps the rows of its last
    ``arrival_window`` updates, since each rank is last in only about 1/N of them.
    """
    rows = list(complete_rows(sync_samples).values())
    return penalties_from_rows(np.array(rows).reshape(-1, len(sync_samples)), sigmas)


def complete_rows(sync_samples) -> dict[int, list[float]]:
    """``{update: [sync seconds of rank 0, 1, ...]}`` for the updates every rank reported."""
    n = len(sync_samples)
    by_update: dict[int, dict[int, float]] = {}
    for rank, pairs in enumerate(sync_samples):
        for update, seconds in pairs:
            if math.isfinite(seconds) and seconds >= 0:
                by_update.setdefault(int(update), {})[rank] = float(seconds)
    return {u: [v[r] for r in range(n)] for u, v in by_update.items() if len(v) == n}


def penalties_from_rows(sync: np.ndarray, sigmas: float = 2.0) -> np.ndarray:
    """:func:`arrival_penalties` from an (updates x ranks) array of sync seconds.

    A rank last in only one update (or in all but one) has no spread to judge a difference by:
    its penalty is 0. (A minimum count of 3 before any penalty paid on no REAL profile and was
    removed: geometric mean 1.023 without it.)"""
    n = sync.shape[1]
    out = np.full(n, np.nan)
    if n < 2 or sync.shape[0] < 2:
        return out
    allreduce, last = sync.min(axis=1), sync.argmin(axis=1)
    for i in range(n):
        mine = last == i
        if mine.sum() >= 2 and (~mine).sum() >= 2:
            own, others = allreduce[mine], allreduce[~mine]
            # Welch's standard error of the difference of the means; throttling makes the
            # allreduce bimodal (a quota period hit or not), so medians of small groups jump
            se = math.sqrt(own.var(ddof=1) / own.size + others.var(ddof=1) / others.size)
            out[i] = max(0.0, float(own.mean() - others.mean()) - sigmas * se)
        elif mine.any() and (~mine).any():
            out[i] = 0.0
    return out


def limit_changed(before: np.ndarray, now: np.ndarray, tolerance: float = 0.1) -> np.ndarray:
    """Per rank: did its CPU limit (cores; inf = none that binds) change by more than ``tolerance``
    (relative), or stop binding, since the last rebalance? NaN before = not seen yet. A limit that
    starts to bind is not a change: a rank is only reported limited while it uses at least half
    of its limit, so a small rank given more samples under the same quota starts to bind."""
    both = np.isfinite(before) & np.isfinite(now)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(both, now / np.where(both, before, 1.0), 1.0)
    freed = np.isfinite(before) & np.isinf(now)
    return freed | (both & (np.abs(np.log(ratio)) > np.log1p(tolerance)))


def fmt_limit(limit: float) -> str:
    """A CPU limit for a note: ``0.17 of a core``, or ``none that binds``."""
    return "none that binds" if not np.isfinite(limit) else f"{limit:.2g} of a core"


def throttle_offsets(sync_cpu, cpu_limit) -> np.ndarray:
    """Seconds each rank under a CPU limit needs for its part of the sync, beyond the least of them.

    The sync phase costs every rank CPU: its part of the ring (the same on every rank), Horovod's
    negotiation, the wake-ups while it waits. Under a limit of ``L < 1`` cores a rank gets that CPU
    at rate ``L``, so its part takes ``w * (1 / L - 1)`` longer than on a free core, and every rank
    waits for it. ``w`` is the least CPU any rank spent in its sync phases (``sync_cpu``: each
    rank's median per update): what a rank spends beyond that is waiting, and a waiting rank that
    spins (MPI's busy polling: 50-100 ms of CPU per update on the fast ranks) is not working.
    Giving a throttled rank less compute lets it start the sync early enough: under quotas
    0.5,0.5,0.5,0.17 the update is ~20% faster with the starved rank at 1-4 samples than at the
    split that equalises compute finish times. Ranks without a limit (or
    without a measurement) get 0, so emulated and unthrottled runs are unchanged; equal limits
    give equal offsets, which change no split.
    """
    n = len(sync_cpu)
    measured = [x for x in sync_cpu if x is not None and math.isfinite(x) and x >= 0]
    need = np.zeros(n)
    if not measured:
        return need
    work = min(measured)
    for i, limit in enumerate(cpu_limit):
        if limit is not None and 0 < limit < 1:
            need[i] = work * (1.0 / limit - 1.0)
    return need - need.min()


def latency_offsets(latency: np.ndarray) -> np.ndarray:
    """Seconds to add to each rank's fixed cost: its cheapest round trip to another rank, minus
    the cluster's least such.

    A round trip costs both ends. A rank on a slow link is slow to every other rank, so even its
    cheapest round trip is long; a rank that merely pings a starved one (0.06 of a core, which
    answers when the scheduler runs it) has a cheap round trip to some other rank. The mean over
    the others counted that starvation once in every row, differently for each pair: 13-19 ms
    on one of three equal-limit ranks while rank 3 was starved, which split them 12,62,54.
    Non-finite entries are ignored; a rank with none finite (or a single
    rank) gets 0.
    """
    n = latency.shape[0]
    if n < 2 or latency.shape != (n, n):
        return np.zeros(n)
    links = np.where(np.isfinite(latency), latency, np.inf)
    np.fill_diagonal(links, np.inf)  # a rank's latency to itself says nothing about its links
    cheapest = links.min(axis=1)
    if not np.isfinite(cheapest).any():
        return np.zeros(n)
    return np.where(np.isfinite(cheapest), cheapest - cheapest[np.isfinite(cheapest)].min(), 0.0)


def in_ms(parts: dict) -> dict:
    """Per-rank seconds -> rounded milliseconds (None where unknown), for a JSON log line."""
    return {k: [round(float(v) * 1000, 3) if math.isfinite(v) else None for v in vs] for k, vs in parts.items()}
