"""The public API: uneven, measured batch allocation inside any Horovod training loop.

``Balancer`` is the runtime around an allocation :mod:`strategy <bno_hvd.allocation>`: it measures
this rank, rebalances every K updates through rank 0, and hands each rank its slice of the global
batch and the loss weight that makes uneven slices exact (a loop of your own: its docstring). Its
parts, each in its own module: the clock (``library.timing``), the CPU limit
(``processes.cpulimit``), the control plane and plan (``library.control``), the sample stream
(``allocation.sampler``). The drop-in surface for a Horovod script: :mod:`bno_hvd.library.dropin`.
"""

from __future__ import annotations

import numpy as np

from bno_hvd.allocation.costmodel import SequenceCost, work_per_sequence
from bno_hvd.allocation.sampler import UnevenSampler
from bno_hvd.allocation.weighting import rank_weight
from bno_hvd.common.arguments import check_balancer, check_int, dataset_length, first_line
from bno_hvd.common.errors import UsageError, WarningLog
from bno_hvd.library.control.controller import Controller
from bno_hvd.library.control.monitor import process_memory_bytes
from bno_hvd.library.control.plane import RankReport
from bno_hvd.library.loader import Batch, LoaderFeed, make_loader
from bno_hvd.library.samplerface import SamplerFace
from bno_hvd.library.step import Step, TextOptions
from bno_hvd.library.timing import StepStats, StepTimer
from bno_hvd.processes.collectives import sleep_until
from bno_hvd.processes.cpulimit import BindingLimit
from bno_hvd.processes.heap import keep_freed_memory

__all__ = ["Balancer", "Step", "StepStats", "TextOptions"]


class Balancer(SamplerFace):
    """Measures this rank, rebalances every ``rebalance_every`` updates through rank 0, and hands
    out each rank's slice of the global batch with the loss weight that makes uneven slices exact:
    built in a sampler's place by :meth:`for_world`, or in a loop of your own (below).

    Args:
        comm: an mpi4py communicator reserved for the control plane (``MPI.COMM_WORLD.Dup()``).
        strategy: a :class:`~bno_hvd.Strategy` (used on rank 0; all ranks pass the same kind).
        dataset_len: the number of samples in the dataset.
        seed: the sample order, and the per-sample augmentation and dropout seeds.
        rebalance_every: updates between two rebalances.
        monitor: an optional started :class:`~bno_hvd.MetricsMonitor`.
        window: recent updates this rank keeps and reports at a rebalance (what the fits see).
        max_batch: this rank's memory cap in samples (larger batches run as micro-batches).
        lag: the allocation lag D (None: the smallest that suits the loader).
        report_filter: ``report_filter(report, update)`` may change what this rank reports (faults).
        sync: ``sync()`` waits for a GPU's queued work before the end of compute is timed.
        sit_out: the strategy may give a rank other than 0 no samples, for a loop that then leaves
            it out of the allreduce, as bno-hvd's own does (``bno_hvd.library.catchup``); None (what
            ``for_world`` passes): once a drop-in takes the balancer (:func:`~bno_hvd.DistributedOptimizer`,
            :func:`~bno_hvd.DistributedDataParallel`), which then sits such a rank out itself
            (``bno_hvd.library.sitout``); a split given by hand may have zeros from the start.
        text: a :class:`~bno_hvd.TextOptions` for samples of their own lengths (token sequences).

    Example (without a loader, ``start_step()`` gives ``step.indices`` instead)::

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
        sit_out: bool | None = False,
        text: TextOptions | None = None,
    ):
        if text is None:
            text = TextOptions()
        elif not isinstance(text, TextOptions):
            raise UsageError(f"text= takes a bno_hvd.TextOptions(lengths=..., ...), got {type(text).__name__}")
        dataset_len = check_balancer(**{k: v for k, v in locals().items() if k not in ("self", "text")}, **vars(text))
        keep_freed_memory()  # a user's own loop too: no page faults on every update (bno_hvd/processes/heap.py)
        strategy.sit_out_ok = sit_out is not False  # a rank may get 0 samples (library/catchup.py, sitout.py)
        self.sit_out_wanted = sit_out  # None: once a drop-in sits ranks out (self.sit_out)
        self.sit_out = None  # a drop-in's bno_hvd.library.sitout.SitOut
        self.sit_out_from = 0  # the first update a rank may sit out (DDP: 2, see library/ddp.py)
        self.models: list = []  # the models whose state travels to a rank back (bno.exact and the drop-ins)
        self.control = Controller(comm, strategy, lag)
        self.rank, self.size = self.control.rank, self.control.size
        self.strategy = strategy
        self.rebalance_every = rebalance_every
        self.monitor = monitor
        self.max_batch = max_batch
        self.report_filter = report_filter
        self.max_tokens = text.max_tokens
        self.sampler = UnevenSampler(
            dataset_len,
            seed=seed,
            lengths=None if text.lengths is None else np.asarray(text.lengths),
            work=np.asarray(text.work) if text.shares else None,
            global_count=text.global_count,
            global_tokens=text.global_tokens,
        )
        self.work = None if text.work is None else np.asarray(text.work, dtype=float)
        self.cost = text.cost  # the SequenceCost ``work`` came from (kept in checkpoints)
        self.emulated_work = None if text.emulated_work is None else np.asarray(text.emulated_work, dtype=float)
        self.timer = StepTimer(window, sync)
        self.limit = BindingLimit()
        self.warnings = WarningLog()  # the one channel: the loop prints what is new on rank 0
        self.gradients_weighted = False  # a drop-in weights the gradients, not the loss: BatchNorm's frame
        self._step, self._computed = None, False  # the open step (a Step), and whether end_compute() came for it
        self.before_step = None  # called as each update starts, before its split is read (bno.elastic's boundary)
        self._sat_out = False  # this rank had no samples in its last update
        self._someone_out = False  # ... some rank had none

    # -- what the loop asks ---------------------------------------------------------------

    @property
    def plan(self):
        """The ``AllocationPlan`` every rank holds (``bno_hvd.allocation.plan``)."""
        return self.control.plan

    @property
    def update(self) -> int:
        """Updates finished (= the index of the next update)."""
        return self.plan.done

    @property
    def batch_sizes(self) -> list[int]:
        """Every rank's batch of the next update (its sequences, when the plan holds shares of work)."""
        return self.sampler.counts_at(self.sampler.position, self.plan.sizes(self.plan.done))

    @property
    def global_batch(self) -> int:
        return int(sum(self.batch_sizes))

    def loader(self, dataset, **dataloader_kwargs):
        """A ``torch.utils.data.DataLoader`` of this rank's slices (collective: every rank calls it).

        Takes DataLoader's loading options (``num_workers``, ``prefetch_factor``, ``pin_memory``,
        ``persistent_workers``, ``collate_fn``, ...) and ``seed_samples`` (see ``bno_hvd.library.loader``).
        Each iteration is one epoch of :class:`bno_hvd.library.loader.Batch` objects."""
        if dataset_length(dataset, "loader()'s dataset") != self.sampler.dataset_len:
            raise UsageError(
                f"the dataset has {len(dataset)} samples but the balancer was made for "
                f"{self.sampler.dataset_len}; pass len(dataset) to Balancer"
            )
        feed = LoaderFeed(self.plan, self.sampler, self.rank, self.agree_lag)
        return make_loader(feed, dataset, **dataloader_kwargs)

    def batches(self, loader, updates: int):
        """``loader``'s batches, epoch after epoch, until ``updates`` updates are done (also for a
        :class:`bno_hvd.DataLoader`: no batch beyond the last update is drawn)."""
        check_int("batches(updates=)", updates, 0, 10**12, "the update to stop at")
        while self.update < updates:
            for batch in loader:
                yield batch
                if self.update >= updates:
                    return

    def agree_lag(self, depth: int) -> int:
        """Collective: the lag every rank uses for loaders that read ``depth`` batches ahead."""
        return self.control.agree_lag(depth)

    def start_step(self, batch: Batch | None = None) -> Step:
        """Begin an update: this rank's work and loss weight. ``batch`` comes from :meth:`loader`."""
        if self.before_step is not None:
            self.before_step()
        update = self.plan.done
        shares = self.plan.sizes(update)
        sizes = self.sampler.counts_at(self.sampler.position, shares)  # = shares unless split by work
        slim = batch is not None and self.work is None and self.emulated_work is None and self.sampler.lengths is None
        mine = None if slim else self.sampler.slice_at(self.sampler.position, shares, self.rank)[0]
        if batch is None:
            indices, size = mine, len(mine)
        else:
            indices, size = None, self._check(batch, update, sizes)
        if size > 0 and self._sat_out:
            self.timer.forget()  # back after sitting out: what it measured before is old
        self._sat_out, self._someone_out = size == 0, 0 in sizes
        self.timer.start()
        keys = () if batch is None else batch.keys
        step = Step(update, sizes, rank_weight(sizes, self.rank), size, indices, self.max_batch, keys)
        if self.sampler.work is not None:
            step.shares = shares
        if self.work is not None:
            step.work = int(round(float(self.work[mine].sum())))
        if self.emulated_work is not None:
            step.emulated_work = float(self.emulated_work[mine].sum())
        if self.sampler.lengths is not None:  # weight: this rank's share of the global batch's tokens
            step.lengths = self.sampler.lengths[mine]
            step.global_tokens = self.sampler.tokens_at(self.sampler.position, shares, self.rank)[0]
            step.weight = int(step.lengths.sum()) / step.global_tokens
            step.token_cap, step.cap = self.max_tokens, None
        self._step, self._computed = step, False
        return step

    @property
    def current_step(self) -> Step | None:
        """The step between :meth:`start_step` and :meth:`end_step`, else None."""
        return self._step

    @property
    def compute_ended(self) -> bool:
        return self._computed

    def mark_backward_end(self) -> None:
        """A backward pass of the open step ended: :meth:`end_compute` ends compute there."""
        if self._step is not None:
            self.timer.mark_backward_end()

    def end_compute(self) -> float:
        """Mark the end of forward+backward; returns the compute phase in seconds."""
        step = self._require_step()
        seconds = self.timer.end_compute(step.size if step.shares is None else step.work)  # in work when split by it
        self._computed = True
        return seconds

    def finish_step(self) -> StepStats | None:
        """End the open step, if any (its compute too, if not ended yet): for a batch whose
        ``optimizer.step()`` never came (a GradScaler skipped it). Collective, as :meth:`end_step`."""
        if self._step is None:
            return None
        if not self._computed:
            self.end_compute()
        return self.end_step()

    def end_step(self) -> StepStats:
        """Mark the end of the optimizer step; rebalances (collectively) every K updates."""
        step = self._require_step()
        stats = self.timer.end(step.update, step.batch_sizes, sat_out=step.size == 0)
        self.sampler.advance(step.global_batch)
        self.plan.finish_update()
        self._step, self._computed = None, False
        if self.monitor is not None and self.monitor.error:
            self.warnings.warn(
                f"the latency/memory monitor stopped ({self.monitor.error}); allocations use the last measurements"
            )
        if self.update % self.rebalance_every == 0:
            result = self.rebalance()
            stats.rebalance_seconds, stats.rebalanced = result.seconds, True
            stats.rank_memory, stats.rank_steps = result.memory_used, result.recent_steps
            stats.rebalance_note, stats.rebalance_model = result.note, result.model
        self.timer.done()
        return stats

    # -- the control plane ----------------------------------------------------------------

    def report(self) -> RankReport:
        """This rank's current measurements."""
        row = self.monitor.latest_row() if self.monitor is not None else _own_row(self.rank, self.size)
        memory = self.monitor.memory_used if self.monitor is not None else process_memory_bytes()
        report = RankReport(
            self.rank,
            self.timer.steps.ops(),
            memory,
            [float(x) for x in row],
            self.timer.steps.samples(),
            self.max_batch,
            warnings=self.warnings.drain() if self.rank != 0 else [],
            sync_samples=list(self.timer.syncs),
            sync_cpu=self.timer.sync_cpu(),
            cpu_limit=self.limit.read(self.timer.compute_use),
            cpu_period=self.limit.period,
            cycle_samples=list(self.timer.cycles),
            cpu_share=self.timer.cpu_share(),
            cpu_per_wall=self.timer.cpu_per_wall(),
        )
        return self.report_filter(report, self.update) if self.report_filter else report

    def rebalance(self):
        """Collective: gather, allocate on rank 0, broadcast; used from update ``done + lag - 1``."""
        if self._someone_out:
            # a rank that sat the updates out arrives here long before the others: MPI's gather would spin its
            # CPU limit away from Horovod's background thread (the others' sync 66 ms, not ~10); this sleeps
            sleep_until([self.control.plane.comm.Ibarrier().Test])
        may = self.sit_out_wanted is True or (self.sit_out_wanted is None and self.sit_out is not None)
        self.strategy.sit_out_ok = may and self.update >= self.sit_out_from
        result = self.control.rebalance(self.report(), self.update)
        for warning in result.warnings:  # rank 0: the strategy's, and what the other ranks sent
            self.warnings.warn(warning)
        return result

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """What the next update depends on: updates done, decided allocations, stream position."""
        cost = None if self.cost is None else self.cost.to_dict()
        return {"update": self.update, "sampler": self.sampler.state_dict(), "cost": cost, **self.control.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        try:
            self.control.load_state_dict(state)
            self.sampler.load_state_dict(state["sampler"])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
            if isinstance(err, UsageError):
                raise
            why = first_line(err)
            raise UsageError(f"the state does not fit this run ({why}); give what state_dict() returned") from None
        if state.get("cost") is not None and self.sampler.lengths is not None:
            # the resumed run splits by the cost the interrupted one measured, not by a new measurement
            self.cost = SequenceCost(**{k: float(v) for k, v in state["cost"].items()})
            self.work = work_per_sequence(self.sampler.lengths, self.cost)
            if self.sampler.work is not None:
                self.sampler.work = self.work

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
            raise UsageError("end_compute()/end_step() without an open step: call start_step() first in each update")
        return self._step


def _own_row(rank: int, size: int) -> np.ndarray:
    return np.where(np.arange(size) == rank, 0.0, np.nan)
