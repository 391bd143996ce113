"""Benchmark arithmetic (pure): throughput, fraction of ideal, compute balance, the share of an
update spent outside compute, control-plane cost, and recovery after a change of speeds.

Inputs are what a run logs: rank 0's :class:`~bno_hvd.training.results.UpdateRecord` list (``time`` =
training seconds since the start, measured after the update) and every rank's
:class:`~bno_hvd.library.timing.RankStep` list.

"Ideal" is the throughput if no rank ever waited: the sum over ranks of each rank's own compute
throughput (samples / compute seconds) measured in the same run.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from bno_hvd.library.timing import RankStep
from bno_hvd.training.results import (
    UpdateRecord,
    compute_balance,
    compute_balance_of_means,
    outside_compute_share,
)


@dataclass
class BenchSummary:
    strategy: str
    updates: int
    samples_per_s: float
    mean_weight_update_time: float  # seconds
    ideal_samples_per_s: float
    fraction_of_ideal: float
    control_overhead: float  # share of wall time spent in rebalances
    control_ms_per_rebalance: float = 0.0
    compute_balance: float = math.nan  # mean over updates of mean/max per-rank compute time
    compute_balance_of_means: float = math.nan  # the same of each rank's mean compute time (noise averaged out)
    outside_compute_share: float = math.nan  # share of update time not spent in the slowest compute
    allreduce_alone: float = math.nan  # seconds: the gradient allreduce without compute (its floor)
    speedup_vs_equal: float | None = None
    final_batch_sizes: list[int] | None = None
    mean_global_batch: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(
    strategy: str, records: list[UpdateRecord], rank_steps: list[list[RankStep]], warmup: int = 0, alone=None
) -> BenchSummary:
    """Summary over updates ``warmup..end`` (the first ones include start-up costs)."""
    if len(records) <= warmup + 1:
        raise ValueError(f"need more than {warmup + 1} updates to summarise, got {len(records)}")
    recs = records[warmup:]
    t_begin = records[warmup - 1].time if warmup > 0 else recs[0].time - recs[0].weight_update_time
    wall = recs[-1].time - t_begin
    samples = sum(r.global_batch for r in recs)
    ideal = ideal_throughput(rank_steps, warmup)
    control = control_seconds(rank_steps, warmup)
    events = rebalance_count(rank_steps, warmup)
    throughput = samples / wall
    return BenchSummary(
        strategy=strategy,
        updates=len(recs),
        samples_per_s=throughput,
        mean_weight_update_time=float(np.mean([r.weight_update_time for r in recs])),
        ideal_samples_per_s=ideal,
        fraction_of_ideal=throughput / ideal if ideal > 0 else math.nan,
        control_overhead=control / wall,
        control_ms_per_rebalance=1e3 * control / events if events else 0.0,
        compute_balance=compute_balance(rank_steps, warmup),
        compute_balance_of_means=compute_balance_of_means(rank_steps, warmup),
        outside_compute_share=outside_compute_share(recs, [s[warmup:] for s in rank_steps]),
        allreduce_alone=max(wall for wall, _ in alone) if alone else math.nan,
        final_batch_sizes=list(records[-1].batch_sizes),
        mean_global_batch=samples / len(recs),
    )


def ideal_throughput(rank_steps: list[list[RankStep]], warmup: int = 0) -> float:
    """Sum over ranks of samples / compute seconds (from update ``warmup`` on)."""
    total = 0.0
    for steps in rank_steps:
        b = sum(s.batch for s in steps[warmup:])
        t = sum(s.compute for s in steps[warmup:])
        total += b / t if t > 0 else 0.0
    return total


def control_seconds(rank_steps: list[list[RankStep]], warmup: int = 0) -> float:
    """Cost of the rebalances: per rebalance the *smallest* time any rank spent in it.

    Every rank waits in the gather for the last one to arrive; that wait is step-time skew
    the next allreduce would have paid anyway. The last rank to arrive pays only the real
    cost (gather + allocation on rank 0 + broadcast), and that is the minimum.
    """
    per_update = np.array([[s.rebalance for s in steps[warmup:]] for steps in rank_steps], dtype=float)
    return float(per_update.min(axis=0).sum()) if per_update.size else 0.0


def rebalance_count(rank_steps: list[list[RankStep]], warmup: int = 0) -> int:
    if not rank_steps:
        return 0
    return sum(1 for s in rank_steps[0][warmup:] if s.rebalance > 0)


@dataclass
class Move:
    """A change of the split: from ``update`` on, the ranks run ``sizes``; ``note`` says why when the
    strategy did not simply follow its fit (a probe, see allocation.balanced)."""

    update: int
    sizes: list[int]
    note: str | None = None


def moves(records: list[UpdateRecord]) -> list[Move]:
    """Every change of the split in a run, in order, and every decision with a note that kept it
    (a rank kept out on what was measured without it): the rebalance after update ``u`` decides
    the sizes of ``u + 1``; its note is logged on ``u``'s record."""
    return [
        Move(cur.update, list(cur.batch_sizes), prev.rebalance_note)
        for prev, cur in zip(records, records[1:])
        if list(cur.batch_sizes) != list(prev.batch_sizes) or prev.rebalance_note
    ]


def format_moves(changes: list[Move], limit: int = 12) -> str:
    """One line per move (the first ``limit - 1`` and the last when there are more)."""
    shown = changes if len(changes) <= limit else changes[: limit - 1] + [None] + changes[-1:]
    lines = []
    for m in shown:
        if m is None:
            lines.append(f"... {len(changes) - limit} more")
            continue
        lines.append(f"update {m.update:>6}: {','.join(map(str, m.sizes))}" + (f"  {m.note}" if m.note else ""))
    return "\n".join(lines)


def with_speedups(summaries: list[BenchSummary]) -> list[BenchSummary]:
    equal = next((s for s in summaries if s.strategy == "equal"), None)
    for s in summaries:
        s.speedup_vs_equal = s.samples_per_s / equal.samples_per_s if equal else None
    return summaries


def rolling_efficiency(records: list[UpdateRecord], rank_steps: list[list[RankStep]], window: int) -> list[float]:
    """Per update: throughput over the last ``window`` updates / ideal over the same updates."""
    times = [r.time for r in records]
    out = []
    for u in range(len(records)):
        lo = max(0, u - window + 1)
        start = times[lo - 1] if lo > 0 else times[0] - records[0].weight_update_time
        done = sum(r.global_batch for r in records[lo : u + 1]) / max(1e-12, times[u] - start)
        ideal = sum(
            sum(s.batch for s in steps[lo : u + 1]) / max(1e-12, sum(s.compute for s in steps[lo : u + 1]))
            for steps in rank_steps
        )
        out.append(done / ideal if ideal > 0 else math.nan)
    return out


def recovery_intervals(
    efficiency: list[float], changes: list[int], rebalance_every: int, threshold=0.9
) -> list[float | None]:
    """For each change at update ``c``: rebalance intervals until the rolling efficiency (over a
    window of ``rebalance_every`` updates, see :func:`rolling_efficiency`) is back at
    ``threshold`` (one number, or one per change), counting only windows that lie wholly after the
    change (None: never before the next change or the end). 1.0 means the first full interval after
    the change was there."""
    out = []
    bounds = list(changes) + [len(efficiency)]
    limits = threshold if isinstance(threshold, (list, tuple)) else [threshold] * len(changes)
    for c, nxt, limit in zip(changes, bounds[1:], limits):
        first = c + rebalance_every - 1
        hit = next((u for u in range(first, nxt) if efficiency[u] >= limit), None)
        out.append(None if hit is None else (hit - c + 1) / rebalance_every)
    return out


def best_plateaus(efficiencies: dict[str, list[float]], changes: list[int]) -> list[float]:
    """Per change, the highest steady efficiency any strategy reached before the next change (the
    median of its rolling efficiency over the second half of that stretch). Under real throttling
    the allreduce keeps every strategy far below the compute-only ideal; recovery then means
    reaching 90% of what the best strategy sustains there."""
    bounds = list(changes) + [min(len(e) for e in efficiencies.values())]
    out = []
    for c, nxt in zip(changes, bounds[1:]):
        mid = c + (nxt - c) // 2
        out.append(max(float(np.median(e[mid:nxt])) for e in efficiencies.values() if len(e[mid:nxt])))
    return out


@dataclass
class RankBreakdown:
    """Where one rank's updates go, averaged over the measured updates (seconds, and CPU share)."""

    rank: int
    batch: float
    gap: float  # before its step: getting the batch, logging
    compute: float  # forward and backward (emulated wait included)
    sync: float  # the allreduce, including waiting for slower ranks
    cpu_share: float  # CPU seconds used / wall seconds (all threads; 1.0 = one full core)
    cpu_sync: float = 0.0  # CPU seconds per update in the sync phase (the allreduce's work, and any spinning)
    cpu_alone: float = math.nan  # CPU seconds of one allreduce without compute (collectives.allreduce_alone)


def rank_breakdown(rank_steps: list[list[RankStep]], warmup: int = 0, alone=None) -> list[RankBreakdown]:
    """``alone``: per rank (wall, CPU) seconds of the allreduce without compute, if measured."""
    out = []
    for r, steps in enumerate(rank_steps):
        s = steps[warmup:] or steps
        n = max(1, len(s))
        wall = sum(x.seconds for x in s)
        out.append(
            RankBreakdown(
                r,
                sum(x.batch for x in s) / n,
                sum(x.gap for x in s) / n,
                sum(x.compute for x in s) / n,
                sum(x.sync for x in s) / n,
                sum(x.cpu for x in s) / wall if wall > 0 else math.nan,
                sum(x.cpu_sync for x in s) / n,
                alone[r][1] if alone else math.nan,
            )
        )
    return out


def format_breakdown(rows: list[RankBreakdown]) -> str:
    head = (
        f"{'rank':>6}{'batch':>8}{'gap ms':>9}{'compute ms':>12}{'sync ms':>10}{'CPU share':>11}{'sync CPU ms':>13}"
        f"{'alone CPU ms':>14}"
    )
    lines = [head] + [
        f"{r.rank:>6}{r.batch:>8.1f}{1e3 * r.gap:>9.1f}{1e3 * r.compute:>12.1f}{1e3 * r.sync:>10.1f}"
        f"{r.cpu_share:>11.2f}{1e3 * r.cpu_sync:>13.1f}{1e3 * r.cpu_alone:>14.1f}"
        for r in rows
    ]
    return "\n".join(lines)


TABLE_COLUMNS = (
    "strategy",
    "samples_per_s",
    "mean_weight_update_time",
    "speedup_vs_equal",
    "fraction_of_ideal",
    "compute_balance",
    "compute_balance_of_means",
    "outside_compute_share",
    "allreduce_alone",
    "control_overhead",
    "control_ms_per_rebalance",
    "mean_global_batch",
    "final_batch_sizes",
)


def format_table(summaries: list[BenchSummary]) -> str:
    head = (
        f"{'strategy':<13}{'samples/s':>10}{'update (ms)':>12}{'vs equal':>9}{'of ideal':>9}"
        f"{'balance':>8}{'of means':>9}{'outside':>8}{'alone ms':>9}{'control':>9}{'ms/rebal':>9}{'global B':>9}"
        "  final sizes"
    )
    lines = [head, "-" * len(head)]
    for s in summaries:
        speed = f"{s.speedup_vs_equal:.2f}x" if s.speedup_vs_equal is not None else "-"
        lines.append(
            f"{s.strategy:<13}{s.samples_per_s:>10.1f}{s.mean_weight_update_time * 1e3:>12.1f}"
            f"{speed:>9}{s.fraction_of_ideal:>9.1%}{s.compute_balance:>8.2f}{s.compute_balance_of_means:>9.2f}"
            f"{s.outside_compute_share:>8.0%}{s.allreduce_alone * 1e3:>9.1f}"
            f"{s.control_overhead:>9.2%}{s.control_ms_per_rebalance:>9.2f}{s.mean_global_batch:>9.1f}"
            f"  {','.join(map(str, s.final_batch_sizes or []))}"
        )
    return "\n".join(lines)
