"""Gather every rank's measurements on rank 0, allocate there, broadcast the batch sizes.

Horovod does the gradient allreduce; this module carries only control traffic, on a
communicator the caller reserves for it (``MPI.COMM_WORLD.Dup()``).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

from bno_hvd.allocation import ClusterMetrics
from bno_hvd.allocation.strategy import valid_sizes
from bno_hvd.common.arguments import describe, first_line
from bno_hvd.common.errors import TrainingError, UsageError


@dataclass
class RankReport:
    """What one rank tells rank 0 at a rebalance."""

    rank: int
    ops: float | None  # samples/s of its compute phase
    memory_used: float  # bytes
    latency_row: list[float]  # seconds to every rank, NaN where unknown
    compute_samples: list[tuple[int, float]] = field(default_factory=list)
    max_batch: int | None = None
    warnings: list[str] = field(default_factory=list)  # this rank's new warnings, for rank 0 to show
    recent_steps: list = field(default_factory=list)  # (update, RankStep) since the last report, if a hook sends them
    sync_samples: list[tuple[int, float]] = field(default_factory=list)  # (update, sync seconds), recent updates
    sync_cpu: float | None = None  # median CPU seconds of its recent sync phases
    cpu_limit: float | None = None  # its cgroup's CPU limit in cores (None: none)
    cpu_period: float | None = None  # that limit's CFS period in seconds (None: no limit)
    cycle_samples: list[tuple[int, float]] = field(default_factory=list)  # (update, its whole update's seconds)
    cpu_share: float | None = None  # its time on a CPU over its runnable time (StepTimer.cpu_share)
    cpu_per_wall: float | None = None  # its CPU seconds per wall second (StepTimer.cpu_per_wall)

    def is_finite(self) -> bool:
        """False when a number is missing or non-finite (NaN latency = pair not measured yet)."""
        if self.ops is None or not math.isfinite(self.ops) or self.ops <= 0:
            return False
        if not math.isfinite(self.memory_used):
            return False
        if any(math.isinf(x) for x in self.latency_row):
            return False
        return all(math.isfinite(t) for _, t in self.compute_samples)


def reports_to_metrics(reports: list[RankReport]) -> ClusterMetrics:
    """Assemble rank 0's view. Missing latency pairs are completed symmetrically."""
    import numpy as np

    from bno_hvd.library.control.schedule import complete_matrix

    rows = np.array([r.latency_row for r in reports], dtype=float)
    return ClusterMetrics(
        ops=[r.ops for r in reports],
        memory_used=[r.memory_used for r in reports],
        latency=complete_matrix(rows).tolist(),
        compute_samples=[list(r.compute_samples) for r in reports],
        max_batch=[r.max_batch for r in reports],
        sync_samples=[list(r.sync_samples) for r in reports],
        sync_cpu=[r.sync_cpu for r in reports],
        cpu_limit=[r.cpu_limit for r in reports],
        cpu_period=[r.cpu_period for r in reports],
        cycle_samples=[list(r.cycle_samples) for r in reports],
        cpu_share=[r.cpu_share for r in reports],
        cpu_per_wall=[r.cpu_per_wall for r in reports],
    )


@dataclass
class RebalanceResult:
    batch_sizes: list[int]
    seconds: float  # gather + compute + broadcast, as seen by this rank
    warnings: list[str] = field(default_factory=list)  # rank 0: the strategy's and every rank's
    memory_used: list[float] | None = None  # rank 0: every rank's reported memory (bytes)
    recent_steps: list | None = None  # rank 0: every rank's RankReport.recent_steps
    note: str | None = None  # rank 0: why the strategy moved, when not to its fit's split (a probe)
    model: dict | None = None  # rank 0: per rank, what the split came from (the strategy's last_model)


class ControlPlane:
    """Rank-0-centred control traffic on ``comm``.

    Usage::

        plane = ControlPlane(MPI.COMM_WORLD.Dup())
        sizes = plane.rebalance(strategy, report, current, update).batch_sizes
    """

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def gather(self, report: RankReport) -> list[RankReport] | None:
        return self.comm.gather(report, root=0)

    def broadcast(self, batch_sizes: list[int] | None) -> list[int]:
        return self.comm.bcast(batch_sizes, root=0)

    def decide_on_root(self, decide):
        """Collective: ``decide()`` runs on rank 0 and every rank returns its result. Whatever
        it raises there (a user's strategy may raise anything) reaches every rank as the same
        one-line error, a :class:`UsageError` as itself and anything else as a
        :class:`TrainingError`, instead of leaving the others waiting in ``bcast`` for rank 0."""
        payload = None
        if self.rank == 0:
            try:
                payload = ("ok", decide())
            except UsageError as err:
                payload = ("usage", one_line(str(err)))
            except Exception as err:  # noqa: BLE001 - every rank must hear of it (see the doc)
                payload = ("training", f"rank 0 failed while allocating: {first_line(err)}{_where(err)}")
        kind, value = self.comm.bcast(payload, root=0)
        if kind != "ok":  # every rank ends next: rank 0 must not leave MPI before the others have the message
            self.comm.Barrier()  # (a rank that was still on its way to this bcast once crashed in MPI instead)
        if kind == "usage":
            raise UsageError(value)
        if kind == "training":
            raise TrainingError(value)
        return value

    def rebalance(self, strategy, report: RankReport, current: list[int], update: int) -> RebalanceResult:
        """Collective. Rank 0 runs ``strategy.rebalance``; bad metrics or a ValueError or
        ArithmeticError there keep ``current`` (with a warning), any other error ends every rank."""
        t0 = time.perf_counter()
        reports = self.gather(report)
        found = {}

        def decide():
            sizes, warning = allocate_on_root(strategy, reports, current, update)
            found["note"] = getattr(strategy, "last_note", None) if sizes != list(current) else None
            found["warnings"] = [warning] if warning else []
            found["warnings"] += [f"rank {r.rank}: {w}" for r in reports for w in r.warnings]
            found["memory"] = [r.memory_used if math.isfinite(r.memory_used) else None for r in reports]
            found["recent"] = [r.recent_steps for r in reports]
            found["model"] = getattr(strategy, "last_model", None)
            return sizes

        sizes = self.decide_on_root(decide)
        if not valid_sizes(sizes, self.size, getattr(strategy, "sit_out_ok", False)):
            raise TrainingError(f"rank 0 broadcast an invalid allocation {describe(sizes)} for {self.size} ranks")
        f = found.get
        return RebalanceResult(
            list(sizes), time.perf_counter() - t0, f("warnings", []), f("memory"), f("recent"), f("note"), f("model")
        )


def allocate_on_root(strategy, reports: list[RankReport], current: list[int], update: int):
    """Rank 0's part of a rebalance (pure): never lets bad metrics poison the allocation."""
    bad = [r.rank for r in reports if not r.is_finite()]
    if bad:
        return list(current), f"non-finite metrics from rank(s) {bad}; kept the last allocation"
    try:
        sizes = strategy.rebalance(reports_to_metrics(reports), list(current), update)
    except (ValueError, ArithmeticError) as err:
        return list(current), f"allocation failed ({err}); kept the last allocation"
    warning = strategy.last_warning
    sizes = [int(b) for b in sizes]
    if not valid_sizes(sizes, len(current), getattr(strategy, "sit_out_ok", False)):
        return list(current), f"strategy returned an invalid allocation {sizes}; kept the last one"
    return sizes, warning


def one_line(message: str) -> str:
    """``message`` with its line breaks turned into spaces (an error must stay one line)."""
    return " ".join(message.split()) or "(no message)"


def _where(err: BaseException) -> str:
    """`` (at file.py:LINE)``: where ``err`` was raised, for an error that has to stay one line."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return ""
    return f" (at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno})"
