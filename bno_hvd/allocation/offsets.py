"""What ``balanced`` adds to each rank's time besides its compute: its sync phase paid at its CPU
limit's rate (:func:`throttle_offsets`), in seconds beyond the rank that pays least, so a uniform
cluster gets nothing; and the helpers that write its notes and log lines. The model it enters is
described in :mod:`bno_hvd.allocation.balanced`."""

from __future__ import annotations

import math

import numpy as np


def fmt_limit(limit: float) -> str:
    """A CPU limit for a note: ``0.17 of a core``, or ``none that binds``."""
    return "none that binds" if not np.isfinite(limit) else f"{limit:.2g} of a core"


def least_sync_cpu(sync_cpu) -> float | None:
    """The least CPU any rank spent in its sync phases (``w`` of :func:`throttle_offsets`; None: none measured)."""
    measured = [x for x in sync_cpu if x is not None and math.isfinite(x) and x >= 0]
    return min(measured) if measured else None


def throttle_offsets(sync_cpu, cpu_limit, least=None) -> np.ndarray:
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
    give equal offsets, which change no split. ``least``: per rank, a ``w`` to charge it at the
    least (NaN: none), e.g. the one measured in the larger set it would return to.
    """
    need, work = np.zeros(len(sync_cpu)), least_sync_cpu(sync_cpu)
    if work is None:
        return need
    floor = np.full(len(sync_cpu), work) if least is None else np.fmax(work, np.asarray(least, dtype=float))
    for i, limit in enumerate(cpu_limit):
        if limit is not None and 0 < limit < 1:
            need[i] = floor[i] * (1.0 / limit - 1.0)
    return need - need.min()


def beyond_budget(offsets, cpu_limit, cpu_period) -> np.ndarray:
    """Seconds of each rank's charge (``offsets``, :func:`throttle_offsets`) that waiting cannot buy
    back: a rank that waits for the others saves at most one CFS period's budget, ``L * P`` CPU
    seconds, which then run at a full core's speed, ``P * (1 - L)`` seconds sooner. The rest of its
    part starts when the last rank arrives. -inf where the period is not known."""
    out = np.full(len(offsets), -np.inf)
    for i, (limit, period) in enumerate(zip(cpu_limit, cpu_period)):
        if limit is not None and 0 < limit < 1 and period is not None:
            out[i] = offsets[i] - period * (1.0 - limit)
    return out


def in_ms(parts: dict) -> dict:
    """Per-rank seconds -> rounded milliseconds (None where unknown), for a JSON log line."""
    return {k: [round(float(v) * 1000, 3) if math.isfinite(v) else None for v in vs] for k, vs in parts.items()}
