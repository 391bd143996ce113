"""Where a run's time went, from what it logged (pure): compute balance and the share of an update
spent outside compute. The loop reports them at the end of every run (``result.json``, the last
line of ``train``); ``bench`` (:mod:`bno_hvd.lab.benchstats`) puts them in its table.
"""

from __future__ import annotations

import math

import numpy as np

from bno_hvd.library.timing import RankStep
from bno_hvd.training.results import UpdateRecord


def compute_matrix(rank_steps: list[list[RankStep]], warmup: int = 0) -> np.ndarray:
    """Compute seconds as an array [rank, update] (updates every rank logged)."""
    n = min((len(s) for s in rank_steps), default=0)
    return np.array([[s.compute for s in steps[warmup:n]] for steps in rank_steps], dtype=float)


def compute_balance(rank_steps: list[list[RankStep]], warmup: int = 0) -> float:
    """Mean over updates of (mean over ranks / max over ranks) of the compute time: 1 when every
    rank computes for the same time, 1/N when one rank does all the computing."""
    m = compute_matrix(rank_steps, warmup)
    if m.size == 0:
        return math.nan
    worst = m.max(axis=0)
    ok = worst > 0
    return float(np.mean(m.mean(axis=0)[ok] / worst[ok])) if ok.any() else math.nan


def compute_balance_of_means(rank_steps: list[list[RankStep]], warmup: int = 0) -> float:
    """Mean over ranks / max over ranks of each rank's mean compute time per update. Per update,
    CPU throttling makes compute times jitter by up to a quota period; this shows the split."""
    m = compute_matrix(rank_steps, warmup)
    if m.size == 0:
        return math.nan
    means = m.mean(axis=1)
    return float(means.mean() / means.max()) if means.max() > 0 else math.nan


def outside_compute_share(records: list[UpdateRecord], rank_steps: list[list[RankStep]]) -> float:
    """Share of the weight-update time not spent in the slowest rank's compute (ratio of sums):
    the allreduce, waiting that compute balance cannot remove, logging and the control plane."""
    m = compute_matrix(rank_steps)
    n = min(len(records), m.shape[1] if m.size else 0)
    if n == 0:
        return math.nan
    cycles = np.array([r.weight_update_time for r in records[:n]])
    return float(np.clip(cycles - m[:, :n].max(axis=0), 0, None).sum() / cycles.sum())


def where_time_went(records, rank_steps) -> tuple[float | None, float | None, float | None]:
    """Compute balance (per update, of the means) and the share of an update outside compute, as
    ``bench`` reports them, over the whole run; None where a run has nothing to measure."""

    def finite(x: float) -> float | None:
        return x if math.isfinite(x) else None

    if not records or not any(rank_steps):
        return None, None, None
    return (
        finite(compute_balance(rank_steps)),
        finite(compute_balance_of_means(rank_steps)),
        finite(outside_compute_share(records, rank_steps)),
    )
