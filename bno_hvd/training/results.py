"""What a run measures, one definition each: rank 0's record of an update, and one rank's step.

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
from dataclasses import dataclass, field

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
