"""The public API: uneven, measured batch allocation inside any Horovod training loop.

``Balancer`` is the runtime around an allocation :mod:`strategy <bno_hvd.allocation>` (``balanced``,
``bno``, ...): it measures this rank, rebalances every K updates through rank 0, and hands each
rank its slice of the global batch and the loss weight that makes uneven slices exact.

Usage (README has the full example)::

    bal = Balancer(MPI.COMM_WORLD.Dup(), make_strategy("balanced", hvd.size(), 32), len(data))
    loader = bal.loader(data, num_workers=2)           # this rank's slices, through a DataLoader
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Sum)
    for batch in bal.batches(loader, updates=100):     # epoch after epoch
        step = bal.start_step(batch)                    # checks the batch, gives the loss weight
        x, y = batch.data
        opt.zero_grad()
        (F.cross_entropy(model(x), y) * step.weight).backward()
        bal.end_compute()
        opt.step()
        bal.end_step()                                  # measures; rebalances every K updates

Without a loader, ``start_step()`` gives ``step.indices`` to index an in-memory dataset.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from .control.monitor import process_memory_bytes
from .control.plane import ControlPlane, RankReport
from .cpuquota import cpu_limit
from .errors import UsageError, WarningLog
from .heap import keep_freed_memory
from .loader import Batch, make_loader
from .plan import AllocationPlan
from .records import RankStep
from .sampler import UnevenSampler
from .throughput import StepWindow
from .weighting import rank_weight


@dataclass
class Step:
    """One update as seen by one rank."""

    update: int
    batch_sizes: list[int]  # every rank's batch this update
    weight: float  # n_rank / sum(n): multiply the mean loss by it, allreduce with Sum
    size: int  # this rank's batch
    indices: np.ndarray | None = None  # without a loader: this rank's sample indices
    cap: int | None = None  # this rank's memory cap: samples per forward/backward pass

    @property
    def micro_batches(self) -> int:
        """Forward/backward passes this rank's batch takes under its memory cap."""
        return 1 if self.cap is None else -(-self.size // self.cap)

    def parts(self):
        """``(slice, share)`` per micro-batch: the samples of one pass, and their share of the batch."""
        per = self.size if self.cap is None else self.cap
        for start in range(0, self.size, per):
            stop = min(self.size, start + per)
            yield slice(start, stop), (stop - start) / self.size

    @property
    def batch_size(self) -> int:
        return self.size

    @property
    def global_batch(self) -> int:
        return int(sum(self.batch_sizes))


@dataclass
class StepStats:
    """What :meth:`Balancer.end_step` measured for the update just finished."""

    update: int
    batch_sizes: list[int]
    compute_seconds: float  # start of step -> end of backward (emulated wait included)
    sync_seconds: float  # end of backward -> optimizer step done (allreduce and waiting)
    cpu_seconds: float  # CPU time of this process (all threads) in the update
    cpu_sync_seconds: float = 0.0  # ... of it in the sync phase (the allreduce's work, and any spinning)
    gap_seconds: float = 0.0  # previous update's end -> this step's start (loading the batch, logging)
    rebalance_seconds: float = 0.0
    rebalanced: bool = False
    rank_memory: list | None = None  # at a rebalance, on rank 0: every rank's memory in bytes
    rank_steps: list | None = None  # at a rebalance, on rank 0: every rank's RankReport.recent_steps
    rebalance_note: str | None = None  # at a rebalance, on rank 0: why it moved, if not to the fit (a probe)

    def rank_step(self, batch: int, micro_batches: int = 1) -> RankStep:
        return RankStep(
            batch,
            self.compute_seconds,
            self.sync_seconds,
            self.rebalance_seconds,
            self.cpu_seconds,
            micro_batches,
            self.gap_seconds,
            self.cpu_sync_seconds,
        )


class Balancer:
    """Measures this rank, rebalances every ``rebalance_every`` updates through rank 0, and
    hands out each rank's slice of the global batch.

    ``comm`` is an mpi4py communicator reserved for the control plane; ``strategy`` an
    :class:`bno_hvd.allocation.Strategy` (used on rank 0; all ranks must pass the same kind).
    ``monitor`` is an optional started :class:`bno_hvd.control.monitor.MetricsMonitor`;
    ``max_batch`` this rank's memory cap in samples; ``lag`` the allocation lag D (None: the
    smallest that suits the loader, see :mod:`bno_hvd.plan`); ``report_filter(report, update)``
    may change what this rank reports (fault injection uses it); ``sync()`` waits for a GPU's
    queued work before the end of compute is timed.
    """

    def __init__(
        self,
        comm,
        strategy,
        dataset_len: int,
        *,
        seed: int = 0,
        rebalance_every: int = 10,
        monitor=None,
        window: int = 20,
        max_batch: int | None = None,
        lag: int | None = None,
        report_filter=None,
        sync=None,
    ):
        if rebalance_every < 1:
            raise UsageError(f"rebalance_every must be >= 1, got {rebalance_every}")
        keep_freed_memory()  # a user's own loop too: no page faults on every update (bno_hvd/heap.py)
        self.plane = ControlPlane(comm)
        self.rank, self.size = self.plane.rank, self.plane.size
        self.strategy = strategy
        self.rebalance_every = rebalance_every
        self.monitor = monitor
        self.max_batch = max_batch
        self.report_filter = report_filter
        self.sync = sync  # waits for the device's queued work before a clock is read (a GPU)
        self.sampler = UnevenSampler(dataset_len, seed=seed)
        self.window = StepWindow(window)
        self.syncs: deque[tuple[int, float]] = deque(maxlen=window)  # (update, sync seconds), for rank 0
        self.sync_cpus: deque[float] = deque(maxlen=window)  # CPU seconds of each sync phase, for rank 0
        self.cpu_use: deque[tuple[float, float]] = deque(maxlen=window)  # (CPU s, wall s) of each update
        self._bound: float | None = None  # the CPU limit this rank last ran into (kept while it stays)
        self.fixed_lag = lag
        initial = self.plane.broadcast(strategy.initial() if self.rank == 0 else None)
        self.plan = AllocationPlan(initial, lag=lag or 1)
        self.warnings = WarningLog()  # the one channel: the loop prints what is new on rank 0
        self._step: Step | None = None
        self._t0 = self._t_compute = self._cpu0 = self._cpu_compute = self._gap = 0.0
        self._last_end: float | None = None  # when the previous update ended (end_step returned)

    # -- what the loop asks ---------------------------------------------------------------

    @property
    def update(self) -> int:
        """Updates finished (= the index of the next update)."""
        return self.plan.done

    @property
    def batch_sizes(self) -> list[int]:
        """Every rank's batch of the next update."""
        return self.plan.sizes(self.plan.done)

    @property
    def global_batch(self) -> int:
        return int(sum(self.batch_sizes))

    def loader(self, dataset, **dataloader_kwargs):
        """A ``torch.utils.data.DataLoader`` of this rank's slices (collective: every rank calls it).

        Takes DataLoader's loading options (``num_workers``, ``prefetch_factor``, ``pin_memory``,
        ``persistent_workers``, ``collate_fn``, ...) and ``seed_samples`` (see :mod:`bno_hvd.loader`).
        Each iteration is one epoch of :class:`bno_hvd.loader.Batch` objects."""
        if len(dataset) != self.sampler.dataset_len:
            raise UsageError(
                f"the dataset has {len(dataset)} samples but the balancer was made for "
                f"{self.sampler.dataset_len}; pass len(dataset) to Balancer"
            )
        return make_loader(self, dataset, **dataloader_kwargs)

    def batches(self, loader, updates: int):
        """``loader``'s batches, epoch after epoch, until ``updates`` updates are done."""
        while self.update < updates:
            for batch in loader:
                if self.update >= updates:
                    return
                yield batch

    def agree_lag(self, depth: int) -> int:
        """Collective: the lag every rank uses for loaders that read ``depth`` batches ahead."""
        deepest = max(self.plane.comm.allgather(int(depth)))
        needed = deepest + 1
        if self.fixed_lag is not None and self.fixed_lag < needed:
            raise UsageError(
                f"allocation lag {self.fixed_lag} is too small: a loader reads {deepest} batches "
                f"ahead (num_workers x prefetch_factor), so allocations need a lag of at least "
                f"{needed}; raise it or leave it unset"
            )
        self.plan.raise_lag(needed)
        return self.plan.lag

    def start_step(self, batch: Batch | None = None) -> Step:
        """Begin an update: this rank's work and loss weight. ``batch`` comes from :meth:`loader`."""
        update = self.plan.done
        sizes = self.plan.sizes(update)
        if batch is None:
            indices, _ = self.sampler.slice_at(self.sampler.position, sizes, self.rank)
            size = len(indices)
        else:
            indices, size = None, self._check(batch, update, sizes)
        self._t0, self._cpu0 = time.perf_counter(), time.process_time()
        self._gap = self._t0 - self._last_end if self._last_end is not None else 0.0
        self._step = Step(update, sizes, rank_weight(sizes, self.rank), size, indices, self.max_batch)
        return self._step

    def end_compute(self) -> float:
        """Mark the end of forward+backward; returns the compute phase in seconds."""
        step = self._require_step()
        if self.sync is not None:
            self.sync()
        self._t_compute, self._cpu_compute = time.perf_counter(), time.process_time()
        compute = self._t_compute - self._t0
        # What the strategies see of this rank: its local time per update, i.e. compute plus the
        # work before it (getting the batch, logging), which delays its arrival at the allreduce
        # just like compute does - and on a CPU-starved rank is several times longer than elsewhere.
        self.window.add(step.size, compute + self._gap)
        return compute

    def end_step(self) -> StepStats:
        """Mark the end of the optimizer step; rebalances (collectively) every K updates."""
        step = self._require_step()
        now = time.perf_counter()
        stats = StepStats(
            step.update,
            step.batch_sizes,
            compute_seconds=self._t_compute - self._t0,
            sync_seconds=now - self._t_compute,
            cpu_seconds=time.process_time() - self._cpu0,
            cpu_sync_seconds=time.process_time() - self._cpu_compute,
            gap_seconds=self._gap,
        )
        self.syncs.append((step.update, stats.sync_seconds))
        self.sync_cpus.append(stats.cpu_sync_seconds)
        self.cpu_use.append((stats.cpu_seconds, now - self._t0))
        self.sampler.advance(step.global_batch)
        self.plan.finish_update()
        self._step = None
        if self.monitor is not None and self.monitor.error:
            self.warnings.warn(
                f"the latency/memory monitor stopped ({self.monitor.error}); allocations use the last measurements"
            )
        if self.update % self.rebalance_every == 0:
            result = self.rebalance()
            stats.rebalance_seconds, stats.rebalanced = result.seconds, True
            stats.rank_memory, stats.rank_steps = result.memory_used, result.recent_steps
            stats.rebalance_note = result.note
        self._last_end = time.perf_counter()
        return stats

    # -- the control plane ----------------------------------------------------------------

    def report(self) -> RankReport:
        """This rank's current measurements."""
        row = self.monitor.latest_row() if self.monitor is not None else _own_row(self.rank, self.size)
        memory = self.monitor.memory_used if self.monitor is not None else process_memory_bytes()
        report = RankReport(
            self.rank,
            self.window.ops(),
            memory,
            [float(x) for x in row],
            self.window.samples(),
            self.max_batch,
            warnings=self.warnings.drain() if self.rank != 0 else [],
            sync_samples=list(self.syncs),
            sync_cpu=float(np.median(self.sync_cpus)) if self.sync_cpus else None,
            cpu_limit=self._binding_cpu_limit(),
        )
        return self.report_filter(report, self.update) if self.report_filter else report

    def _binding_cpu_limit(self) -> float | None:
        """This rank's cgroup CPU limit (cores) if it binds: the rank used at least half of it over
        its recent updates. A limit the rank does not run into (a GPU rank waiting on its device)
        says nothing about how fast it does its part of the allreduce.

        Once a limit has bound it counts until it changes: a throttled rank that ``balanced`` then
        gives a few samples waits for the others most of an update and uses less than half of
        it, and dropping the limit then would undo the split that made it wait (seen: rank 3 at
        0.1 of a core moved from 1 to 11 samples and back)."""
        limit = cpu_limit()
        if limit is None or limit != self._bound:
            self._bound = None
        cpu, wall = (sum(x) for x in zip(*self.cpu_use)) if self.cpu_use else (0.0, 0.0)
        if limit is not None and wall > 0 and cpu / wall >= 0.5 * limit:
            self._bound = limit
        return self._bound

    def rebalance(self):
        """Collective: gather, allocate on rank 0, broadcast; used from update ``done + lag - 1``."""
        result = self.plane.rebalance(self.strategy, self.report(), self.plan.latest(), self.update)
        for warning in result.warnings:  # rank 0: the strategy's, and what the other ranks sent
            self.warnings.warn(warning)
        self.plan.decide(result.batch_sizes)
        return result

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """What the next update depends on: updates done, decided allocations, stream position."""
        return {
            "update": self.update,
            "plan": self.plan.state_dict(),
            "sampler": self.sampler.state_dict(),
            "strategy": self.strategy.state_dict() if self.rank == 0 else None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.plan.load_state_dict(state["plan"])
        self.sampler.load_state_dict(state["sampler"])
        if self.rank == 0 and state.get("strategy") is not None:
            self.strategy.load_state_dict(state["strategy"])

    # -- helpers --------------------------------------------------------------------------

    def _check(self, batch, update: int, sizes: list[int]) -> int:
        if not isinstance(batch, Batch):
            raise UsageError(f"start_step() takes a batch from Balancer.loader(), got {type(batch).__name__}")
        if batch.error is not None:
            raise UsageError(batch.error, rank=self.rank)
        for note in getattr(batch, "notes", ()):
            self.warnings.warn(note)
        if batch.update != update:
            raise UsageError(
                f"the loader delivered the batch of update {batch.update} while the loop is at "
                f"update {update}; one loader per balancer, consumed in order",
                rank=self.rank,
            )
        if batch.size != sizes[self.rank]:
            raise UsageError(
                f"batch of update {update} has {batch.size} samples but rank {self.rank} was "
                f"allocated {sizes[self.rank]}",
                rank=self.rank,
            )
        return batch.size

    def _require_step(self) -> Step:
        if self._step is None:
            raise RuntimeError("call start_step() first")
        return self._step


def _own_row(rank: int, size: int) -> np.ndarray:
    row = np.full(size, np.nan)
    row[rank] = 0.0
    return row
