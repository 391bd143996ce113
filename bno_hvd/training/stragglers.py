"""Who waited for whom (pure): per update, each rank's compute, the time it waited for the rank
that arrived last, and the exchange every rank pays, from every rank's :class:`RankStep` list.

Words (see :mod:`bno_hvd.training.results`): a rank's *sync* phase runs from the end of its backward pass
to the end of its optimizer step. The gradient allreduce cannot finish on any rank before the
last rank has handed in its gradients, and it finishes on all ranks at about the same moment
(the skew is a few network latencies). So a rank's sync phase is the time it waited for the last
rank to arrive plus the exchange after that arrival, which every rank pays alike; the last rank
to arrive has the shortest sync. Hence, per update::

    waited_r   = (sync_r - min_k sync_k) + (rebalance_r - min_k rebalance_k)
    exchange   = min_k sync_k + min_k rebalance_k          (the same for every rank)
    compute_r + waited_r + exchange = RankStep.seconds      (the whole update as rank r saw it)

The rebalance terms are the same reasoning for the control plane's gather (0 in updates without
a rebalance). Only *durations* enter, each measured on its own rank's clock: ranks on different
hosts need no common clock, and no timestamp of one host is compared with another's.

A rank waits for whoever arrives last, also when that rank is late for a reason outside its
measured step (rank 0 writes the logs between two updates): the picture then shows the others
waiting and rank 0 "last" with an ordinary compute time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bno_hvd.library.timing import RankStep


@dataclass
class StragglerTimeline:
    """Arrays [rank, update] in seconds; ``last[u]`` is the rank that arrived last in update u."""

    compute: np.ndarray
    waited: np.ndarray
    exchange: np.ndarray  # [update]: the allreduce and control plane after the last arrival
    last: np.ndarray
    has_sync: bool  # False for logs without sync times (written before they were measured)

    @property
    def ranks(self) -> int:
        return self.compute.shape[0]

    @property
    def updates(self) -> int:
        return self.compute.shape[1]

    def last_share(self) -> list[float]:
        """Per rank: the share of updates in which it arrived last (ties: the lowest rank)."""
        if self.updates == 0:
            return [math.nan] * self.ranks
        return [float(np.mean(self.last == r)) for r in range(self.ranks)]

    def mean_waited(self) -> list[float]:
        """Per rank: mean seconds waited per update."""
        return [float(x) for x in self.waited.mean(axis=1)] if self.updates else [math.nan] * self.ranks


def straggler_timeline(rank_steps: list[list[RankStep]]) -> StragglerTimeline:
    """The timeline over the updates every rank logged (the shortest list decides)."""
    if not rank_steps:
        raise ValueError("no ranks")
    n = min(len(steps) for steps in rank_steps)

    def matrix(name):
        return np.array([[getattr(s, name) for s in steps[:n]] for steps in rank_steps], dtype=float).reshape(
            len(rank_steps), n
        )

    compute, sync, rebalance = matrix("compute"), matrix("sync"), matrix("rebalance")
    if n == 0:
        empty = np.zeros((len(rank_steps), 0))
        return StragglerTimeline(empty, empty.copy(), np.zeros(0), np.zeros(0, dtype=int), False)
    sync_min, rebalance_min = sync.min(axis=0), rebalance.min(axis=0)
    return StragglerTimeline(
        compute=compute,
        waited=(sync - sync_min) + (rebalance - rebalance_min),
        exchange=sync_min + rebalance_min,
        last=sync.argmin(axis=0),
        has_sync=bool(sync.any()),
    )


def waited_seconds(syncs: list[float], rebalances: list[float] | None = None) -> list[float]:
    """One update: each rank's wait for the last arrival, from every rank's sync (and rebalance) seconds."""
    rebalances = rebalances or [0.0] * len(syncs)
    low_s, low_r = min(syncs), min(rebalances)
    return [(s - low_s) + (r - low_r) for s, r in zip(syncs, rebalances)]


def block_means(values: np.ndarray, block: int) -> np.ndarray:
    """Means over consecutive blocks of ``block`` updates along the last axis (the last block may be shorter)."""
    if block <= 1:
        return values
    n = values.shape[-1]
    starts = np.arange(0, n, block)
    sums = np.add.reduceat(values, starts, axis=-1)
    counts = np.diff(np.append(starts, n))
    return sums / counts
