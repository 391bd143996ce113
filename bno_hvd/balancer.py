"""The public API: uneven, measured batch allocation inside any Horovod training loop.

Usage (see README for the full twenty lines)::

    bal = Balancer(MPI.COMM_WORLD.Dup(), make_strategy("balanced", hvd.size(), 32), len(data))
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Sum)
    for _ in range(updates):
        step = bal.start_step()                   # this rank's indices and loss weight
        x, y = data[step.indices]
        opt.zero_grad()
        (F.cross_entropy(model(x), y) * step.weight).backward()
        bal.end_compute()
        opt.step()
        bal.end_step()                            # measures; rebalances every K updates
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .control.monitor import process_memory_bytes
from .control.plane import ControlPlane, RankReport
from .sampler import UnevenSampler
from .throughput import StepWindow
from .weighting import rank_weight


@dataclass
class Step:
    """One update as seen by one rank."""

    update: int
    batch_sizes: list[int]      # every rank's batch this update
    indices: np.ndarray         # this rank's sample indices
    weight: float               # n_rank / sum(n): multiply the mean loss by it, allreduce with Sum
    emulated_wait: float = 0.0  # seconds this rank waited to emulate a slower device

    @property
    def batch_size(self) -> int:
        return len(self.indices)


@dataclass
class StepStats:
    update: int
    batch_sizes: list[int]
    compute_seconds: float      # start of step -> end of backward, emulated wait included
    step_seconds: float         # start of step -> optimizer step done: the weight-update time
    rebalance_seconds: float = 0.0
    rebalanced: bool = False
    rank_memory: list | None = None  # at a rebalance, on rank 0: every rank's memory in bytes


class Balancer:
    """Measures this rank, rebalances every ``rebalance_every`` updates through rank 0, and
    hands out each rank's slice of the global batch.

    ``comm`` is an mpi4py communicator reserved for the control plane; ``strategy`` an
    :class:`bno_hvd.allocation.Strategy` (used on rank 0; all ranks must pass the same kind).
    ``monitor`` is an optional started :class:`bno_hvd.control.monitor.MetricsMonitor`,
    ``emulator`` an optional :class:`bno_hvd.emulation.DeviceEmulator`.
    """

    def __init__(self, comm, strategy, dataset_len: int, *, seed: int = 0, rebalance_every: int = 10,
                 monitor=None, emulator=None, window: int = 20, max_batch: int | None = None):
        if rebalance_every < 1:
            raise ValueError("rebalance_every must be >= 1")
        self.plane = ControlPlane(comm)
        self.rank, self.size = self.plane.rank, self.plane.size
        self.strategy = strategy
        self.rebalance_every = rebalance_every
        self.monitor = monitor
        self.emulator = emulator
        self.max_batch = max_batch
        self.sampler = UnevenSampler(dataset_len, seed=seed)
        self.window = StepWindow(window)
        self.update = 0
        self.batch_sizes = self.plane.broadcast(strategy.initial() if self.rank == 0 else None)
        self.warnings: list[str] = []   # new warnings; the caller prints and clears them
        self._warned: set[str] = set()   # so a persisting condition is reported once
        self._step: Step | None = None
        self._t0 = self._t_compute = 0.0

    @property
    def global_batch(self) -> int:
        return int(sum(self.batch_sizes))

    def start_step(self) -> Step:
        """Begin an update: take the emulated wait (if any) and return this rank's work."""
        sizes = list(self.batch_sizes)
        indices = self.sampler.next_indices(sizes, self.rank)
        self._t0 = time.perf_counter()
        wait = 0.0
        if self.emulator is not None:
            wait = self.emulator.pre_wait(sizes[self.rank], self.update)
            time.sleep(wait)
        self._step = Step(self.update, sizes, indices, rank_weight(sizes, self.rank), wait)
        return self._step

    def end_compute(self) -> float:
        """Mark the end of forward+backward; returns the compute phase in seconds."""
        step = self._require_step()
        self._t_compute = time.perf_counter()
        compute = self._t_compute - self._t0
        if self.emulator is not None:
            real = compute - step.emulated_wait
            self.emulator.record_real(step.batch_size, real, step.update)
            target = self.emulator.target_seconds(step.batch_size, step.update)
            if compute < target:  # prediction was short: finish the emulated compute phase
                time.sleep(target - compute)
                self._t_compute = time.perf_counter()
                compute = self._t_compute - self._t0
        self.window.add(step.batch_size, compute)
        return compute

    def end_step(self) -> StepStats:
        """Mark the end of the optimizer step; rebalances (collectively) every K updates."""
        step = self._require_step()
        now = time.perf_counter()
        stats = StepStats(step.update, step.batch_sizes, self._t_compute - self._t0, now - self._t0)
        self.update += 1
        self._step = None
        if self.update % self.rebalance_every == 0:
            result = self.rebalance()
            stats.rebalance_seconds, stats.rebalanced = result.seconds, True
            stats.rank_memory = result.memory_used
        return stats

    def report(self) -> RankReport:
        """This rank's current measurements."""
        row = self.monitor.latest_row() if self.monitor is not None else _own_row(self.rank, self.size)
        memory = self.monitor.memory_used if self.monitor is not None else process_memory_bytes()
        return RankReport(self.rank, self.window.ops(), memory, [float(x) for x in row],
                          self.window.samples(), self.max_batch)

    def rebalance(self):
        """Collective: gather, allocate on rank 0, broadcast, apply from the next update."""
        result = self.plane.rebalance(self.strategy, self.report(), self.batch_sizes, self.update)
        if result.warning and result.warning not in self._warned:
            self._warned.add(result.warning)
            self.warnings.append(result.warning)
        self.batch_sizes = result.batch_sizes
        return result

    def state_dict(self) -> dict:
        return {"update": self.update, "batch_sizes": list(self.batch_sizes),
                "sampler": self.sampler.state_dict(),
                "strategy": self.strategy.state_dict() if self.rank == 0 else None}

    def load_state_dict(self, state: dict) -> None:
        self.update = int(state["update"])
        self.batch_sizes = [int(b) for b in state["batch_sizes"]]
        self.sampler.load_state_dict(state["sampler"])
        if self.rank == 0 and state.get("strategy") is not None:
            self.strategy.load_state_dict(state["strategy"])

    def _require_step(self) -> Step:
        if self._step is None:
            raise RuntimeError("call start_step() first")
        return self._step


def _own_row(rank: int, size: int) -> np.ndarray:
    row = np.full(size, np.nan)
    row[rank] = 0.0
    return row
