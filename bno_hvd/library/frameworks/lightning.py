"""PyTorch Lightning 2.x: per-rank batch sizes from a strategy named in one place.

``Trainer(strategy=bno.lightning.BalancedStrategy(), accelerator="cpu", devices=4)`` is Lightning's
``DDPStrategy`` (Gloo on CPUs, NCCL on GPUs) over the DDP drop-in (:mod:`bno_hvd.library.ddp`):

- the training ``DataLoader(dataset, batch_size=B, shuffle=True)`` of the LightningModule (or
  datamodule) is replaced, where Lightning puts its ``DistributedSampler``, by the Balancer's
  (``Balancer.for_world(dataset, B)``: the global batch is B x world size, split per rank by the
  strategy, ``balanced`` by default, rebalanced every ``rebalance_every`` updates); its loading
  options (``num_workers``, ``pin_memory``, ``collate_fn``, ...) are kept;
- the LightningModule's dropout and BatchNorm are made exact (:func:`bno_hvd.exact`; with
  ``local_batchnorm=True`` BatchNorm stays per rank, as in Lightning's own DDP) and the module is
  wrapped by :func:`bno_hvd.DistributedDataParallel` (the weighting communication hook),
  so each update is one process's on the whole global batch;
- each rank's batch size is logged through the Trainer's logger (``bno/batch_size/rank<r>``): ``log()``
  at the first update and where the split changes, Lightning keeps the last value in every row;
- the Balancer's state (the position in the sample stream, the decided splits) is the training
  loader's state, which Lightning saves in every checkpoint and restores with ``ckpt_path=``.

Lightning's fetcher may draw a batch before the previous one is trained: a batch's step starts
when its ``training_step`` runs (the queue of drawn batches below), and the allocation lag covers
the extra batch drawn. A rank a split gives 0 samples sits the update out inside Lightning's loop
(:mod:`.lightning_sitout`). Refused in one line (``bno-hvd: error:``): text split by cost, a
strategy that changes the global batch (``bno``), gradient accumulation, memory caps, a loss scale
(``16-mixed``), another DDP communication hook, and the spawn/fork launchers.
"""

from __future__ import annotations

import os
from collections import deque

import torch

try:
    from lightning.pytorch.strategies import DDPStrategy
except ImportError as err:  # pragma: no cover - the extra is not installed
    from bno_hvd.library.frameworks import missing_extra

    missing_extra("bno.lightning needs PyTorch Lightning 2.x", "lightning", err)

from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data._utils.collate import default_collate

from bno_hvd.allocation import Strategy, make_strategy
from bno_hvd.allocation.sampler import updates_left
from bno_hvd.common.arguments import check_flag
from bno_hvd.common.errors import UsageError
from bno_hvd.library.balancer import Balancer
from bno_hvd.library.ddp import balance_ddp
from bno_hvd.library.dropout import exact_dropout
from bno_hvd.library.exact import exact
from bno_hvd.library.frameworks import all_arrived
from bno_hvd.library.frameworks.lightning_sitout import SAT_OUT, EpochEnd, prepare_first_update, sat_out_loss
from bno_hvd.library.loader import prefetch_depth
from bno_hvd.processes.world import exit_with_error, one_line_errors

__all__ = ["BalancedLoader", "BalancedStrategy"]

# what a user's DataLoader keeps when the Balancer takes its batching (torch's defaults are left out)
KEPT = {"num_workers": 0, "pin_memory": False, "timeout": 0, "worker_init_fn": None, "persistent_workers": False}
REFUSED = {
    "lengths": "text split by cost (lengths=, cost=, global_tokens=) is not supported by bno.lightning yet; "
    "use the DDP drop-in (docs/text.md)",
    "max_batch": "a memory cap (max_batch=) runs micro-batches, which Lightning's loop does not: drop it",
    "ddp_comm_hook": "BalancedStrategy registers its own DDP communication hook (the weighting one): drop it",
}
REFUSED.update({k: REFUSED["lengths"] for k in ("cost", "global_tokens", "text")})
REFUSED.update({k: REFUSED["ddp_comm_hook"] for k in ("ddp_comm_state", "ddp_comm_wrapper", "model_averaging_period")})
BALANCER_OPTIONS = ("window", "lag", "monitor", "report_filter", "sit_out")


class BalancedStrategy(DDPStrategy):
    """Lightning's ``DDPStrategy`` with bno-hvd's per-rank batch sizes (see the module doc).

    Args:
        strategy: how each global batch is split: a strategy's name (``"balanced"``, ``"equal"``,
            ``"random"``, ``"balanced:deadband=0.1"``, ``"fixed:8,4,2,2"`` for that split, ...) or a
            :class:`~bno_hvd.Strategy` made for the world size.
        rebalance_every: updates between two splits.
        seed: the sample order and the per-sample dropout seeds (None: ``L.seed_everything``'s
            seed, as Lightning's ``DistributedSampler`` takes it, else 0).
        global_batch: the global batch, when it is not B x world size.
        local_batchnorm: BatchNorm normalises each rank's batch by its own statistics, as Lightning's
            DDP does without ``sync_batchnorm`` (not exact under uneven batches, and no rank sits
            out: DDP then syncs the buffers at every forward); False: by the global batch's (exact).
        **options: the Balancer's ``window``, ``lag``, ``monitor``, ``report_filter``, ``sit_out``
            (False: no rank ever gets 0 samples); the rest
            goes to ``DDPStrategy`` (``find_unused_parameters``, ``process_group_backend``, ...).

    Example::

        trainer = L.Trainer(strategy=bno.lightning.BalancedStrategy(), accelerator="cpu", devices=4)
        trainer.fit(model)      # model.train_dataloader(): DataLoader(train_set, batch_size=64, shuffle=True)
    """

    def __init__(
        self, strategy="balanced", rebalance_every=10, *, seed=None, global_batch=None, local_batchnorm=False, **options
    ):
        one_line_errors()
        self.local_batchnorm = check_flag("local_batchnorm", local_batchnorm)
        for key in options:
            if key in REFUSED:
                raise UsageError(REFUSED[key])
        if options.get("start_method", "popen") != "popen":
            raise UsageError(
                f"start_method={options['start_method']!r} is not supported by BalancedStrategy: use Lightning's "
                "default launcher (start_method='popen'), torchrun or Slurm"
            )
        self.balance = {"rebalance_every": rebalance_every, "global_batch": global_batch, "seed": seed}
        self.balance.update({k: options.pop(k) for k in BALANCER_OPTIONS if k in options})
        self.split = strategy
        self.balancer: Balancer | None = None
        self.loader: BalancedLoader | None = None  # the training loader Lightning iterates
        self.logged: tuple = ()  # (epoch, every rank's batch) last logged
        self.first_update = True  # the next training_step is this process's first
        self.stepping = False  # inside the LightningModule's training_step (its sync_dist: the computing ranks)
        super().__init__(**options)

    # -- Lightning's hooks ---------------------------------------------------------------

    def setup_environment(self) -> None:
        super().setup_environment()
        os.environ.setdefault("RANK", str(self.global_rank))  # as torchrun's: only rank 0 prints an error line

    def setup(self, trainer) -> None:
        if getattr(self.precision_plugin, "scaler", None) is not None:
            refuse(
                "a loss scale (precision='16-mixed', its GradScaler) is not supported by BalancedStrategy yet: "
                "use precision='bf16-mixed' or '32-true'"
            )
        super().setup(trainer)
        if not any(isinstance(c, EpochEnd) for c in trainer.callbacks):
            trainer.callbacks.insert(0, EpochEnd(self))  # first at an epoch's end: the ranks behind catch up

    def configure_ddp(self) -> None:
        """Deferred: the model is wrapped once the training loader gives the Balancer (below)."""

    def process_dataloader(self, dataloader):
        trainer = self.lightning_module.trainer
        if not trainer.training or not isinstance(dataloader, DataLoader):
            return dataloader
        if trainer.accumulate_grad_batches != 1:
            refuse(
                "accumulate_grad_batches > 1 is not supported by BalancedStrategy (each batch is one update of "
                "the Balancer): raise the DataLoader's batch_size instead"
            )
        dataset, batch = dataloader.dataset, dataloader.batch_size
        if isinstance(dataset, IterableDataset) or batch is None:
            refuse(
                "BalancedStrategy splits a map-style dataset's global batch: give the training DataLoader "
                "a Dataset and batch_size=B (no batch_sampler, no IterableDataset)"
            )
        if self.balancer is None:
            self.balancer = self._balancer(dataset, batch)
            self._wrap(self.balancer)
        elif len(dataset) != self.balancer.sampler.dataset_len:
            refuse("the reloaded training set has another length than the first: keep the dataset")
        self.loader = BalancedLoader(self.balancer, dataset, _loading_options(dataloader))
        return self.loader

    def training_step(self, *args, **kwargs):
        if not self.loader.drawn:  # training_step(self, dataloader_iter) draws its batches itself
            refuse("training_step(dataloader_iter) is not supported by BalancedStrategy: take (batch, batch_idx)")
        batch = self.loader.drawn.popleft()  # the oldest batch drawn is the one this step trains
        bal = self.balancer
        bal.finish_step()  # one whose optimizer.step() never came (training_step returned None)
        if bal.sit_out is not None:
            if self.first_update:
                prepare_first_update(bal, self.model)
            bal.sit_out.begin(bal.batch_sizes)  # rank 0's word to a rank out, its state to a rank back
        self.first_update = False
        step = bal.start_step(batch)
        logged = (self.lightning_module.current_epoch, list(step.batch_sizes))
        if logged != self.logged:  # logged where the split changes and as each epoch starts (Lightning
            self.logged = logged  # keeps a value to the epoch's end); four log() calls an update cost ~10%
            log = self.lightning_module.log
            for r, size in enumerate(step.batch_sizes):
                log(f"bno/batch_size/rank{r}", float(size), on_step=True, on_epoch=False, batch_size=1)
        if step.size == 0:  # this rank sits the update out: no forward, no backward, a step that changes nothing
            return sat_out_loss(self.root_device)
        self.stepping = True
        try:
            return super().training_step(*args, **kwargs)
        finally:
            self.stepping = False

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        step = None if self.balancer is None else self.balancer.current_step
        if step is not None and step.size == 0:
            return closure_loss  # sat out: no graph, and DDP's reducer stays out of this update
        return super().backward(closure_loss, optimizer, *args, **kwargs)

    def reduce(self, tensor, group=None, reduce_op="mean"):
        """Lightning's ``sync_dist``: inside a training step where some rank sits out, over the
        ranks that compute (the others run no training_step)."""
        sit_out = None if self.balancer is None else self.balancer.sit_out
        if group is None and self.stepping and sit_out is not None and sit_out.group is not None:
            group = sit_out.group
        return super().reduce(tensor, group=group, reduce_op=reduce_op)

    def on_validation_start(self) -> None:
        self._catch_up()  # every rank validates rank 0's model
        super().on_validation_start()

    def on_train_end(self) -> None:
        self._catch_up()  # every rank ends fit() with rank 0's model (test, predict, save)
        super().on_train_end()

    # -- helpers ------------------------------------------------------------------------

    def _balancer(self, dataset, batch: int) -> Balancer:
        """The Balancer over the world, its strategy checked first on every rank alike (what
        Lightning's loop cannot run is refused before any rank waits for another)."""
        seed = self.balance.pop("seed")
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0)) if seed is None else seed
        try:
            strategy = _strategy(self.split, self.world_size, batch, self.balance.pop("global_batch"), seed)
        except UsageError as err:
            refuse(str(err))
        if strategy.changes_global_batch:
            refuse(
                f"strategy {strategy.name} changes the global batch, which Lightning's epoch length and learning "
                "rate take as fixed: choose balanced, equal, random or fixed"
            )
        options = {k: v for k, v in self.balance.items() if v is not None}
        try:
            return Balancer.for_world(dataset, batch, strategy, seed=seed, **options)
        except UsageError as err:  # a split the strategy cannot give (rank 0 at 0 samples, ...)
            refuse(str(err))

    def _wrap(self, balancer: Balancer) -> None:
        if self.local_batchnorm and any(isinstance(m, torch.nn.SyncBatchNorm) for m in self.lightning_module.modules()):
            refuse("local_batchnorm=True keeps BatchNorm per rank, sync_batchnorm=True syncs it: choose one")
        convert = exact_dropout if self.local_batchnorm else exact
        module = convert(self.lightning_module, balancer)  # Lightning's own DDP wraps the LightningModule too
        options = {"device_ids": self.determine_ddp_device_ids(), **self._ddp_kwargs}
        try:
            ddp = torch.nn.parallel.DistributedDataParallel(module, **options)
            self.model = balance_ddp(ddp, balancer, options, early_sit_out=True)  # buckets: lightning_sitout.py
        except UsageError as err:
            refuse(str(err))

    def _catch_up(self) -> None:
        if self.balancer is not None and self.balancer.sit_out is not None:
            self.balancer.sit_out.catch_up()


class BalancedLoader:
    """The training loader Lightning iterates: yields what the user's DataLoader would (this rank's
    slice of each global batch), keeps each drawn :class:`~bno_hvd.library.loader.Batch` for its
    ``training_step`` (``drawn``), and carries the Balancer's state in Lightning's checkpoints
    (``state_dict``/``load_state_dict``: a loader Lightning resumes)."""

    def __init__(self, balancer: Balancer, dataset, options: dict):
        self.balancer = self.sampler = balancer  # .sampler: Lightning calls its set_epoch (accepted)
        self.dataset = dataset
        self.loader = balancer.loader(dataset, **options)
        # Lightning's fetcher may draw one batch more than torch's DataLoader reads ahead
        balancer.agree_lag(prefetch_depth(options.get("num_workers", 0), options.get("prefetch_factor")) + 1)
        self.drawn: deque = deque()

    def __iter__(self):
        bal = self.balancer
        bal.finish_step()
        self.drawn.clear()
        for batch in self.loader:
            if batch.error is not None:
                raise UsageError(batch.error, rank=bal.rank)
            self.drawn.append(batch)
            yield SAT_OUT if batch.size == 0 else batch.data

    def __len__(self) -> int:
        """The most updates an epoch of the stream has: one whose first global batch starts at the
        epoch's first sample (a later start has one fewer; the loader then ends the epoch itself).
        Lightning reads it once per fit: a resumed run read its own epoch's length, and an epoch
        longer than that lost its last update (2026-12-01)."""
        bal = self.balancer
        return updates_left(bal.sampler.dataset_len, 0, sum(bal.latest_counts()))

    def state_dict(self) -> dict:
        return {"balancer": self.balancer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.balancer.load_state_dict(state["balancer"])  # (a checkpoint before 2026-12-01 also has epoch keys)


def refuse(message: str) -> None:
    """A refusal every rank finds alike inside Lightning's loop: rank 0 says it in one line at once
    (torchrun ends the other ranks as soon as one exits, Lightning's teardown runs first), and
    every rank exits with 2, as a :class:`UsageError` would, once every rank has arrived (at most
    60 s: :func:`~bno_hvd.library.frameworks.refused_alike`)."""
    all_arrived()
    exit_with_error(message, UsageError.exit_code)


def _strategy(spec, world: int, batch: int, global_batch, seed: int) -> Strategy:
    """A :class:`~bno_hvd.Strategy` from a name (``"fixed:8,4,2,2"``: ``fixed`` with that split) or as given."""
    if isinstance(spec, Strategy):
        if global_batch is not None:
            raise UsageError("global_batch= belongs to the strategy: make_strategy(name, N, B, global_batch=G)")
        return spec
    if not isinstance(spec, str):
        raise UsageError(f"strategy must be a strategy's name or a bno.Strategy, got {type(spec).__name__}")
    return make_strategy(spec, world, batch, global_batch=global_batch, seed=seed)


def _loading_options(dataloader: DataLoader) -> dict:
    """The user's loading options, without batching and order (the Balancer's) and torch's defaults."""
    options = {k: getattr(dataloader, k) for k, default in KEPT.items() if getattr(dataloader, k) != default}
    if dataloader.collate_fn is not default_collate:
        options["collate_fn"] = dataloader.collate_fn
    if dataloader.num_workers > 0:
        options["prefetch_factor"] = dataloader.prefetch_factor
        if dataloader.multiprocessing_context is not None:
            options["multiprocessing_context"] = dataloader.multiprocessing_context
    return options
