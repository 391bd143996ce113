"""What a run measured, one definition each: rank 0's record of an update, a run's result, and where
its time went (compute balance and the share of an update outside compute, reported at the end of
every run and in ``bench``'s table).

- :class:`UpdateRecord`: one line of ``updates.jsonl`` (rank 0, every update).
- :class:`~bno_hvd.library.timing.RankStep` (what one rank did in one update, measured by the library):
  ``ranks.json`` holds every rank's list.

Both are read by the benchmark arithmetic (:mod:`bno_hvd.lab.benchstats`), the paper's evaluation
(:mod:`bno_hvd.lab.averages`) and the figures (:mod:`bno_hvd.lab.plots`). Units are seconds, samples
and bytes.

Words used throughout: the *weight-update time* is one full cycle of an update as rank 0 sees
it (compute, gradient allreduce, logging, rebalance), the paper's figure of merit. A rank's
*compute* phase runs from the start of its step to the end of its backward pass; its *sync*
phase from there until the optimizer step is done (the allreduce, including the time spent
waiting for slower ranks).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from bno_hvd.library.timing import RankStep


@dataclass
class UpdateRecord:
    """Rank 0's view of one update (one JSON line of ``updates.jsonl``)."""

    update: int
    batch_sizes: list[int]  # every rank's batch of this update
    weight_update_time: float  # s, one full cycle of this update on rank 0
    global_batch: int  # samples in this update (sum of batch_sizes)
    time: float  # training seconds since the start, after this update
    loss: float = float("nan")  # mean loss over the global batch
    samples_per_s: float = 0.0  # global_batch / weight_update_time
    lr: float = 0.0
    compute_time: float = 0.0  # s, rank 0's compute phase
    sync_time: float = 0.0  # s, rank 0's sync phase (allreduce and waiting)
    rebalance_time: float = 0.0  # s, rank 0's time in the control plane after this update
    gc_time: float = 0.0  # s of rank 0's update in Python's garbage collector (ranks.json: every rank's)
    base_global_batch: int = 0  # N * B, what the learning rate refers to
    rank_memory: list | None = None  # at a rebalance: every rank's memory in use (bytes; None = unknown)
    rebalance_note: str | None = None  # at a rebalance that probed: what and why (see allocation.balanced)
    # at a rebalance (balanced): per rank, the fit's fixed and per-sample cost and the offsets added
    # to the fixed cost (latency, arrival, throttle), in ms: why two ranks got different shares
    rebalance_model: dict | None = None
    global_tokens: int | None = None  # text: tokens (predictions) in this update's global batch
    tokens_per_s: float | None = None  # text: global_tokens / weight_update_time

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> UpdateRecord:
        """Read a logged line; keys of other versions are ignored, missing optional ones defaulted."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


COLUMNS = tuple(f.name for f in dataclasses.fields(RankStep))


def steps_to_json(rank_steps: list[list[RankStep]]) -> dict:
    """``ranks.json``: per rank, one list per field (compact for long runs)."""
    return {"ranks": [{c: [getattr(s, c) for s in steps] for c in COLUMNS} for steps in rank_steps]}


def steps_from_json(data: dict) -> list[list[RankStep]]:
    """Inverse of :func:`steps_to_json`; also reads the older ``{"rank_steps": [[b, compute, rebalance], ...]}``."""
    if "ranks" in data:
        out = []
        for columns in data["ranks"]:
            names = [c for c in COLUMNS if c in columns]
            rows = zip(*(columns[c] for c in names))
            out.append([RankStep(**dict(zip(names, row))) for row in rows])
        return out
    return [[RankStep(batch=s[0], compute=s[1], rebalance=s[2]) for s in steps] for steps in data["rank_steps"]]


@dataclass
class RunResult:
    """What :func:`bno_hvd.training.loop.run_training` returns (rank 0 has the records and every rank's steps)."""

    updates: int
    wall_seconds: float
    samples: int
    final_loss: float
    final_batch_sizes: list[int]
    heterogeneity: str  # the label every table and figure of this run carries
    test_accuracy: float | None = None
    test_correct: int | None = None
    test_total: int | None = None
    evals: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    records: list[UpdateRecord] = field(default_factory=list)
    rank_steps: list[list[RankStep]] = field(default_factory=list)
    allreduce_alone: list[tuple[float, float]] | None = None  # per rank: median wall s, CPU s (bench)
    # rank 0, where every rank's steps were gathered (None: not measured); bno_hvd.lab.benchstats defines them
    compute_balance: float | None = None  # mean over updates of mean/max per-rank compute time
    compute_balance_of_means: float | None = None  # the same of each rank's mean compute time
    outside_compute_share: float | None = None  # share of update time not in the slowest rank's compute
    cpu_limits_outside: list | None = None  # per rank: the CPU limit set outside bno-hvd (None: none)
    tokens: int | None = None  # text: tokens (predictions) trained on, over all updates
    test_perplexity: float | None = None  # text: exp(test_loss) on the held-out split
    test_loss: float | None = None  # text: mean nats per held-out token
    test_tokens: int | None = None

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.tokens is None else (self.tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0)

    def summary(self) -> dict:
        """``result.json``: everything but the per-update lists."""
        out = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("records", "rank_steps")
        }
        out["samples_per_s"] = self.samples_per_s
        out["tokens_per_s"] = self.tokens_per_s
        return out


# -- where a run's time went, from what it logged (compute balance, the share outside compute) --


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
