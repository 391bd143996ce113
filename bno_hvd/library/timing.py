"""What one rank measures of its own updates: the time before its step, its compute, its sync.

The strategies see a rank's *local* time per update: its compute plus the work before it (getting
the batch, logging), which delays its arrival at the allreduce just like compute does, and on a
CPU-starved rank is several times longer than elsewhere. The sync phase (the allreduce and the
waiting for slower ranks) is kept apart, with the CPU the process spent in it: that is what the
arrival penalty and the throttled-sync charge of ``balanced`` read (:mod:`bno_hvd.allocation.offsets`).

Usage (what :class:`bno_hvd.library.balancer.Balancer` does)::

    timer = StepTimer(window=20, sync=device.synchronize)
    timer.start()
    ...forward, backward...
    timer.end_compute(batch)
    ...allreduce, optimizer step...
    stats = timer.end(update, batch_sizes)
    timer.done()                        # after any rebalance: the next gap starts here
"""

from __future__ import annotations

import os
import time
import weakref
from collections import deque
from dataclasses import dataclass

import numpy as np

from bno_hvd.allocation.throughput import StepWindow
from bno_hvd.processes.collector import gc_seconds


@dataclass
class RankStep:
    """One rank's part of one update."""

    batch: int  # samples this rank processed
    compute: float  # s, start of the step -> end of backward (emulated wait included)
    sync: float = 0.0  # s, end of backward -> optimizer step done
    rebalance: float = 0.0  # s in the control plane after this update (0 if none)
    cpu: float = 0.0  # CPU seconds this process used in the update (all its threads)
    micro_batches: int = 1  # forward/backward passes the batch took (memory cap)
    gap: float = 0.0  # s from the previous update's end to this step's start (getting the batch, logging)
    cpu_sync: float = 0.0  # CPU seconds of ``cpu`` spent in the sync phase (the allreduce's work, any spinning)
    tokens: int = 0  # text: tokens (predictions) this rank processed (0 for images)
    gc: float = 0.0  # s of gap, compute and sync spent in Python's garbage collector
    catch_up: float = 0.0  # s before the gap: a state sent or received for a rank back, or a new process set made

    @property
    def seconds(self) -> float:
        """The whole update as this rank saw it."""
        return self.gap + self.compute + self.sync + self.rebalance


@dataclass
class StepStats:
    """What :meth:`bno_hvd.library.balancer.Balancer.end_step` measured for the update just finished."""

    update: int
    batch_sizes: list[int]
    compute_seconds: float  # start of step -> end of backward (emulated wait included)
    sync_seconds: float  # end of backward -> optimizer step done (allreduce and waiting)
    cpu_seconds: float  # CPU time of this process (all threads) in the update
    cpu_sync_seconds: float = 0.0  # ... of it in the sync phase (the allreduce's work, and any spinning)
    gap_seconds: float = 0.0  # previous update's end -> this step's start (loading the batch, logging)
    gc_seconds: float = 0.0  # of gap, compute and sync: in Python's garbage collector (any thread)
    catch_up_seconds: float = 0.0  # before the gap: a state sent or received for a rank back, or a new process set made
    rebalance_seconds: float = 0.0
    rebalanced: bool = False
    rank_memory: list | None = None  # at a rebalance, on rank 0: every rank's memory in bytes
    rank_steps: list | None = None  # at a rebalance, on rank 0: every rank's RankReport.recent_steps
    rebalance_note: str | None = None  # at a rebalance, on rank 0: why it moved, if not to the fit (a probe)
    rebalance_model: dict | None = None  # at a rebalance, on rank 0: per rank, what the split came from

    def rank_step(self, batch: int, micro_batches: int = 1, tokens: int = 0) -> RankStep:
        return RankStep(
            batch,
            self.compute_seconds,
            self.sync_seconds,
            self.rebalance_seconds,
            self.cpu_seconds,
            micro_batches,
            self.gap_seconds,
            self.cpu_sync_seconds,
            tokens,
            self.gc_seconds,
            self.catch_up_seconds,
        )


class StepTimer:
    """One rank's clock over its updates, and the recent measurements it reports at a rebalance.

    ``window``: how many recent updates are kept; ``sync()``: waits for a device's queued work
    before the end of compute is read (a GPU); ``schedstat``: read the kernel's run queue for
    :meth:`cpu_share` where it has one."""

    def __init__(self, window: int = 20, sync=None, schedstat: bool = True):
        self.sync = sync
        self.steps = StepWindow(window)  # (batch, local seconds) of recent updates, for the fits
        self.syncs: deque[tuple[int, float]] = deque(maxlen=window)  # (update, sync seconds)
        self.sync_cpus: deque[float] = deque(maxlen=window)  # CPU seconds of each sync phase
        self.cpu_use: deque[tuple[float, float]] = deque(maxlen=window)  # (CPU s, wall s) of each update
        self.compute_use: deque[tuple[float, float]] = deque(maxlen=window)  # ... of its compute phase
        self.idles: deque[float] = deque(maxlen=window)  # ... of its wall s, waiting on the device (idle)
        self.runs: deque[tuple[float, float]] = deque(maxlen=window)  # (s on a CPU, s runnable waiting for one)
        self._queue = RunQueue() if schedstat else None
        self.cycles: deque[tuple[int, float]] = deque(maxlen=window)  # (update, s from the last one's end)
        self._t0 = self._t_compute = self._cpu0 = self._cpu_compute = self._gap = 0.0
        self._idle = 0.0  # seconds of this update spent waiting on a device, not on the CPU (see idle)
        self._waited = 0.0  # seconds of this compute phase spent waiting for the other ranks (see waited)
        self._last_end: float | None = None  # when the previous update ended
        self._mark: tuple[float, float] | None = None  # (wall, CPU) at the end of the last backward pass
        self._gc = gc_seconds()  # the collector's total when the previous update ended
        self._catch_up = 0.0  # seconds of a catch-up before this update (not part of its gap)

    def start(self) -> None:
        """The step begins: its batch is here."""
        self._t0, self._cpu0 = time.perf_counter(), time.process_time()
        self._gap = self._t0 - self._last_end if self._last_end is not None else 0.0
        self._mark, self._idle, self._waited = None, 0.0, 0.0

    def waited(self, seconds: float) -> None:
        """This rank just spent ``seconds`` inside its compute phase in a collective with the other
        ranks (exact BatchNorm's allreduces in the forward and backward passes): the time goes to
        the sync phase, not to compute, or every rank would measure the slowest rank's compute
        (each waits for it at the layer) and the fits would see equal ranks."""
        self._waited += max(0.0, float(seconds))

    def idle(self, seconds: float) -> None:
        """This rank just waited ``seconds`` for its device, not for a CPU (a GPU's queue, an
        EMULATED device's wait): the time counts as compute, but not as wall time the rank could
        have used the CPU in (:meth:`cpu_share`), or a slower device would look CPU-starved."""
        self._idle += max(0.0, float(seconds))

    def mark_backward_end(self) -> None:
        """A backward pass just ended (the last mark before :meth:`end_compute` ends the compute phase)."""
        if self.sync is not None:
            t = time.perf_counter()
            self.sync()
            self.idle(time.perf_counter() - t)
        self._mark = (time.perf_counter(), time.process_time())

    def end_compute(self, batch: int) -> float:
        """Forward and backward are done (at the last :meth:`mark_backward_end`, if any, else now);
        returns the compute phase in seconds."""
        if self._mark is None:
            self.mark_backward_end()
        self._t_compute, self._cpu_compute = self._mark
        self._mark = None
        self._waited = min(self._waited, self._t_compute - self._t0)  # the waits move to the sync phase
        compute = self._t_compute - self._t0 - self._waited
        if batch > 0:  # an update the rank sat out (no samples) tells nothing of its speed
            self.steps.add(batch, compute + self._gap)
        return compute

    def end(self, update: int, batch_sizes: list[int], sat_out: bool = False) -> StepStats:
        """The optimizer step is done: this update's measurements (``sat_out``: this rank had no
        samples and took no part in the allreduce; its sync and CPU are not kept for the fits)."""
        now, cpu = time.perf_counter(), time.process_time()
        stats = StepStats(
            update,
            batch_sizes,
            compute_seconds=self._t_compute - self._t0 - self._waited,
            sync_seconds=now - self._t_compute + self._waited,
            cpu_seconds=cpu - self._cpu0,
            cpu_sync_seconds=cpu - self._cpu_compute,
            gap_seconds=self._gap,
            gc_seconds=gc_seconds() - self._gc,
            catch_up_seconds=self._catch_up,
        )
        self._catch_up = 0.0
        ran = self._queue.read() if self._queue else None  # since the last update ended (its gap too)
        if sat_out:
            return stats
        self.syncs.append((update, stats.sync_seconds))
        self.sync_cpus.append(stats.cpu_sync_seconds)
        self.cpu_use.append((stats.cpu_seconds, now - self._t0))  # a device wait binds no CPU limit
        self.compute_use.append((self._cpu_compute - self._cpu0, stats.compute_seconds))
        self.idles.append(min(self._idle, now - self._t0))
        self.cycles.append((update, self._gap + now - self._t0))
        if ran is not None:
            self.runs.append(ran)
        return stats

    def forget(self) -> None:
        """Drop the recent steps and syncs (a rank back after sitting out runs at a new speed)."""
        self.steps.clear()
        self.syncs.clear()
        self.sync_cpus.clear()
        self.cpu_use.clear()
        self.compute_use.clear()
        self.idles.clear()
        self.runs.clear()
        if self._queue:
            self._queue.read()

    def done(self, catch_up: float = 0.0) -> None:
        """The update is over (after a rebalance, if any): the next step's gap starts now.
        ``catch_up``: seconds this rank just spent sending or receiving a state, or making the
        process set of a new set of ranks out (:mod:`bno_hvd.library.catchup`), logged apart
        from the gap: not part of the next step's time."""
        self._last_end, self._gc = time.perf_counter(), gc_seconds()
        self._catch_up += catch_up

    def cpu_share(self) -> float | None:
        """How much of the CPU this rank got of what it asked for over the recent updates (None
        before the first), whatever limits it (a quota, busy neighbours on its core): the seconds
        its threads ran on a CPU over the seconds they were runnable (ran, or waited in the run
        queue, or were throttled by a CFS quota; the kernel's schedstat). A rank that waits for
        its device, sleeps in a collective or has less work is not runnable then, so it is not
        starved. Where the kernel keeps no schedstat: :meth:`cpu_per_wall`. A thread that spins
        with ``sched_yield`` (MPI's waits) is runnable all the time: under load its delay is the
        neighbours' slices, not demand (an unthrottled rank on MPI read 0.026 under load), which
        :meth:`cpu_per_wall` does not mistake for starvation."""
        if self.runs:
            ran, waited = (sum(x) for x in zip(*self.runs))
            return ran / (ran + waited) if ran + waited > 0 else None
        return self.cpu_per_wall()

    def cpu_per_wall(self) -> float | None:
        """CPU seconds per wall second over the recent updates (None before the first), the wall
        time without the waits for its device (:meth:`idle`)."""
        cpu, wall = (sum(x) for x in zip(*self.cpu_use)) if self.cpu_use else (0.0, 0.0)
        wall -= sum(self.idles)
        return cpu / wall if wall > 0 else None

    def sync_cpu(self) -> float | None:
        """Median CPU seconds of the recent sync phases (None before the first update)."""
        return float(np.median(self.sync_cpus)) if self.sync_cpus else None


class RunQueue:
    """This process's threads' time on a CPU and time runnable but not running, from the kernel's
    ``/proc/self/task/*/schedstat`` (fields 1 and 2, in ns). A quota's throttled time is counted
    as waiting (measured on Linux 6.18: a busy loop limited to 0.1 of a core for 2 s ran 0.21 s
    and waited 1.81 s; a sleep adds neither). The threads are listed again every ``RELIST``
    reads (the listing was half the reader's cost, ~20 µs an update): a thread that started
    since counts, from its start, at the read that first lists it; one that started and ended
    between two listings is not seen."""

    RELIST = 16

    def __init__(self):
        self._fds: dict[str, int] = {}  # tid -> its schedstat, kept open: re-read in place every update
        # closed when the reader is dropped, however it is (raw descriptors: no ResourceWarning)
        self._closer = weakref.finalize(self, _close_all, self._fds)
        self._reads = 0
        self._last = self._threads()

    def _list(self) -> bool:
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return False
        for tid in set(self._fds) - set(tids):  # threads that ended
            os.close(self._fds.pop(tid))
        for tid in tids:
            if tid not in self._fds:
                try:
                    self._fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:  # the thread has just ended
                    pass
        return True

    def _threads(self) -> dict[str, tuple[int, int]] | None:
        self._reads += 1
        if (self._reads % self.RELIST == 1 or not self._fds) and not self._list():
            return None
        seen = {}
        for tid, fd in list(self._fds.items()):
            try:
                ran, waited = os.pread(fd, 128, 0).split()[:2]
            except (OSError, ValueError):  # the thread has ended
                os.close(self._fds.pop(tid))
                continue
            seen[tid] = (int(ran), int(waited))
        return seen or None

    def close(self) -> None:
        """Close every thread's schedstat now (also done when the reader is garbage)."""
        self._closer()

    def read(self) -> tuple[float, float] | None:
        """(seconds run, seconds waiting) of every thread since the last read (None: no schedstat).
        A thread that ended since loses its last part; one that started counts from its start."""
        now, last = self._threads(), self._last
        self._last = now
        if now is None or last is None:
            return None
        ran = sum(r - last.get(t, (0, 0))[0] for t, (r, _) in now.items())
        waited = sum(w - last.get(t, (0, 0))[1] for t, (_, w) in now.items())
        return ran / 1e9, waited / 1e9


def _close_all(fds: dict[str, int]) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()
