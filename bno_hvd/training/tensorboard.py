"""TensorBoard: rank 0 writes what a run measures while it runs (``--tensorboard DIR``).

A :class:`~bno_hvd.training.hooks.Hook`, built only when the flag is set
(:func:`bno_hvd.training.components.build_hooks`); it writes with PyTorch's ``SummaryWriter`` (the
``tensorboard`` package). The step of every value is the update index. Tags:

=========================  ==========================================================================
``update/loss``            mean loss over the global batch (as ``updates.jsonl``)
``update/samples_per_s``   global batch / weight-update time
``update/tokens_per_s``    text: tokens of the global batch / weight-update time
``update/weight_update_s`` one full cycle of the update on rank 0
``update/global_batch``    samples in the update
``update/lr``              learning rate of the update
``batch/rank_R``           rank R's batch (every update)
``compute_s/rank_R``       rank R's compute phase
``waited_s/rank_R``        rank R's wait for the last rank to arrive (:mod:`bno_hvd.training.stragglers`)
``memory_MiB/rank_R``      rank R's memory in use, at each rebalance
``allocation`` (text)      each change of the batch sizes: ``update U: 32,32,32,32 -> 39,38,38,13``
``heterogeneity`` (text)   the run's label: EMULATED or REAL heterogeneity, or none (``Run.label``)
``run`` (text)             model, dataset, strategy, ranks, batch and rebalance settings
=========================  ==========================================================================

The Custom Scalars tab overlays every rank's batch, compute and waiting in one chart each.

Rank 0 measures only itself; the other ranks' compute times reach it through the control plane:
every rank's hook keeps its :class:`~bno_hvd.library.timing.RankStep` of each update and hands the ones
not yet sent to its next rebalance report (``RankReport.recent_steps``); rank 0 writes them when
that rebalance is over, and the last ones (after the final rebalance) in :meth:`finish`. So the
per-rank compute and waiting lag the rest by up to one rebalance interval. The writer is flushed
after every update: a killed run leaves readable events up to its last finished update.
"""

from __future__ import annotations

import dataclasses
import json

from bno_hvd.common.errors import UsageError
from bno_hvd.training.hooks import Hook
from bno_hvd.training.stragglers import waited_seconds

MIB = 1024 * 1024


def check_tensorboard() -> None:
    """:class:`UsageError` unless PyTorch's SummaryWriter can be imported (before any collective)."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as err:
        raise UsageError(
            f"--tensorboard needs the tensorboard package ({err}); pip install tensorboard (launch/setup does)"
        ) from None


def allocation_change(update: int, before: list[int] | None, after: list[int]) -> str:
    """The text written when the batch sizes of ``update`` differ from the previous update's."""
    sizes = ",".join(map(str, after))
    if before is None:
        return f"update {update}: {sizes} (first update of this run)"
    return f"update {update}: {','.join(map(str, before))} -> {sizes}"


class TensorBoardHook(Hook):
    """Writes a run's measurements to ``log_dir`` (rank 0); every rank sends rank 0 its steps."""

    def __init__(self, log_dir: str, rank: int):
        self.log_dir, self.rank = log_dir, rank
        self.writer = None  # rank 0, from start() to close()
        self._unsent: list = []  # (update, RankStep) of this rank, not yet in a report
        self._sizes: list[int] | None = None  # the previous update's batch sizes
        self._cycles: dict[int, float] = {}  # rank 0: update -> weight-update time, until its steps arrive

    def start(self, run) -> None:
        if self.rank != 0:
            return
        from torch.utils.tensorboard import SummaryWriter

        first = run.resumed_from or 0
        # purge_step: a resumed run replaces what the killed one wrote after its checkpoint
        self.writer = SummaryWriter(self.log_dir, purge_step=run.resumed_from)
        cfg, n = run.cfg, run.world.size
        self.writer.add_text("heterogeneity", run.label, first)
        self.writer.add_text("run", run_text(cfg, n, run.balancer.plan.lag), first)
        per_rank = {
            name: ["Multiline", [f"{tag}/rank_.*"]]
            for name, tag in (("batch size", "batch"), ("compute (s)", "compute_s"), ("waited (s)", "waited_s"))
        }
        self.writer.add_custom_scalars({"ranks": per_rank})
        self.writer.flush()

    def after_update(self, record, stats) -> None:
        self._unsent.append((stats.update, stats.rank_step(stats.batch_sizes[self.rank])))
        if self.writer is None:
            return
        w, u = self.writer, record.update
        self._cycles[u] = record.weight_update_time
        for tag, value in (
            ("update/loss", record.loss),
            ("update/samples_per_s", record.samples_per_s),
            ("update/weight_update_s", record.weight_update_time),
            ("update/global_batch", record.global_batch),
            ("update/lr", record.lr),
            *([("update/tokens_per_s", record.tokens_per_s)] if record.tokens_per_s is not None else []),
        ):
            w.add_scalar(tag, value, u)
        for r, b in enumerate(record.batch_sizes):
            w.add_scalar(f"batch/rank_{r}", b, u)
        for r, used in enumerate(record.rank_memory or []):
            if used is not None:
                w.add_scalar(f"memory_MiB/rank_{r}", used / MIB, u)
        if record.batch_sizes != self._sizes:
            w.add_text("allocation", allocation_change(u, self._sizes, record.batch_sizes), u)
            self._sizes = list(record.batch_sizes)
        if stats.rank_steps:
            self._write_rank_steps(stats.rank_steps)
        w.flush()

    def report(self, report, update: int):
        unsent, self._unsent = self._unsent, []
        return dataclasses.replace(report, recent_steps=unsent)

    def finish(self, comm) -> list[str]:
        """Collective: the steps after the last rebalance reach rank 0 here."""
        tail = comm.gather(self._unsent, root=0)
        self._unsent = []
        if self.writer is not None:
            self._write_rank_steps(tail)
            self.writer.flush()
        return []

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _write_rank_steps(self, rank_steps: list) -> None:
        """``rank_steps[r]``: rank r's (update, RankStep) pairs; every rank sends the same updates."""
        by_update = {}
        for r, pairs in enumerate(rank_steps):
            for update, step in pairs:
                by_update.setdefault(update, {})[r] = step
        for update, steps in sorted(by_update.items()):
            for r, step in steps.items():
                self.writer.add_scalar(f"compute_s/rank_{r}", step.compute, update)
            cycle = self._cycles.pop(update, None)
            if len(steps) == len(rank_steps):
                ranks = sorted(steps)
                waited = waited_seconds([steps[r].sync for r in ranks], [steps[r].rebalance for r in ranks])
                for r, seconds in zip(ranks, waited):
                    self.writer.add_scalar(f"waited_s/rank_{r}", seconds, update)
                # the two figures bench reports, per update (bno_hvd.lab.benchstats)
                compute = [steps[r].compute for r in ranks]
                if max(compute) > 0:
                    self.writer.add_scalar("update/compute_balance", sum(compute) / len(compute) / max(compute), update)
                if cycle:
                    outside = max(0.0, cycle - max(compute)) / cycle
                    self.writer.add_scalar("update/outside_compute_share", outside, update)


def run_text(cfg, ranks: int, lag: int) -> str:
    """The ``run`` text: what was trained, and how (JSON, shown as a code block)."""
    settings = {
        "model": cfg.model,
        "dataset": cfg.dataset,
        "strategy": cfg.strategy,
        "ranks": ranks,
        "base_batch_size": cfg.base_batch_size,
        "rebalance_every": cfg.rebalance_every,
        "allocation_lag": lag,
        "updates": cfg.updates,
    }
    return "    " + json.dumps(settings)
