"""Sitting a rank out inside Lightning's loop (``bno.lightning.BalancedStrategy``, docs/lightning.md).

A rank that a split gives 0 samples keeps Lightning's iteration and does nothing in it, so that
``batch_idx``, ``global_step``, ``max_steps``, step-based validation and checkpoints stay in step on
every rank:

- the training loader hands it :data:`SAT_OUT` (not ``None``: Lightning would skip the whole
  iteration and the rank's ``global_step`` would fall behind); the strategy's ``training_step``
  returns a NaN loss without the model's forward (Lightning refuses ``None`` in distributed
  training), its ``backward`` does nothing, and the optimizer's step finds no gradient and changes
  nothing;
- the ranks that compute reduce their gradients (the DDP drop-in's hook) and exact BatchNorm its
  statistics over a group of their own, and ``log(..., sync_dist=True)`` inside their
  ``training_step`` over that group too (:mod:`bno_hvd.library.sitout`'s ``SitOut``, one
  ``begin`` per update);
- rank 0 (never out) sends a rank back its parameters, BatchNorm's running statistics and the
  optimizer's state before it computes again, and every rank behind before validation, at the
  end of each training epoch and at the end of ``fit`` (:class:`EpochEnd`, the strategy's hooks);
- at the end of an epoch a rank that sat all of it out holds no value of a metric logged with
  ``sync_dist=True`` and ``on_epoch=True``: it takes an empty one (the reduction's identity, no
  samples) so that every rank syncs the same metrics (:func:`fill_epoch_metrics`);
- torch's DDP rebuilds its gradient buckets at its second update by a collective over every rank,
  which a rank out would miss: where a split with zeros is decided that early (a split given by
  hand, a resumed checkpoint), every rank rebuilds them at the first update instead
  (:func:`rebuild_buckets_now`).
"""

from __future__ import annotations

from dataclasses import fields

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.connectors.logger_connector.result import _Metadata, _ResultMetric, _Sync

__all__ = ["SAT_OUT", "EpochEnd", "fill_epoch_metrics", "rebuild_buckets_now"]


class SatOut:
    """The batch of a rank that sits the update out (it holds no samples)."""

    def __repr__(self) -> str:
        return "bno.lightning.SAT_OUT"


SAT_OUT = SatOut()


def sat_out_loss(device) -> torch.Tensor:
    """What ``training_step`` returns on a rank out: no loss was computed (NaN, no graph)."""
    return torch.full((), float("nan"), device=device)


def rebuild_buckets_now(ddp) -> None:
    """DDP's gradient buckets rebuilt at once on every rank alike (before this process's first
    forward), in the parameters' order: torch's DDP would rebuild them at its second update, over
    every rank, and a rank out then would leave the others waiting."""
    ddp.reducer._push_all_rebuilt_params()
    ddp.reducer._rebuild_buckets()


def prepare_first_update(balancer, ddp) -> None:
    """At this process's first update (every rank; the loader's state of a checkpoint is loaded by
    now): where the plan holds a split with zeros, the buckets are rebuilt now and ranks may sit
    out at once; else not before DDP's own rebuild, two updates on."""
    if any(0 in sizes for _, sizes in balancer.plan.changes):
        rebuild_buckets_now(ddp)
        balancer.sit_out_from = balancer.update
    else:
        balancer.sit_out_from = balancer.update + 2


class EpochEnd(Callback):
    """First of the Trainer's callbacks at the end of each training epoch: the ranks behind get
    rank 0's state, and the epoch's synced metrics are the same on every rank."""

    def __init__(self, strategy):
        self.strategy = strategy

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        balancer = self.strategy.balancer
        if balancer is None or balancer.sit_out is None:
            return
        balancer.sit_out.catch_up()
        fill_epoch_metrics(trainer.fit_loop.epoch_loop._results, balancer.control.plane.comm, self.strategy)


def fill_epoch_metrics(results, comm, strategy) -> None:
    """Every rank holds the epoch values rank 0 holds of the metrics logged with ``sync_dist=True``
    and ``on_epoch=True`` (over the default group), in rank 0's order: a rank without one (it sat
    every update of the epoch out) takes an empty one, which adds nothing to the sum of values and
    of batch sizes, and is the identity of ``max``/``min``. Collective over ``comm``."""
    synced = [key for key, metric in results.items() if _synced_on_epoch(metric)]
    wanted = comm.bcast([(key, _meta_fields(results[key].meta)) for key in synced] if comm.Get_rank() == 0 else None)
    mine = dict(results)
    results.clear()
    for key, meta_fields in wanted:
        metric = mine.pop(key, None)
        if metric is None or metric.has_reset:
            metric = _empty_metric(meta_fields, strategy)
        results[key] = metric
    results.update(mine)


def _synced_on_epoch(metric) -> bool:
    sync = metric.meta.sync
    return (
        metric.is_tensor and not metric.has_reset and metric.meta.on_epoch and sync.should and not sync.rank_zero_only
    ) and sync.group is None


def _meta_fields(meta: _Metadata) -> dict:
    return {f.name: getattr(meta, f.name) for f in fields(meta) if f.name != "_sync"}


def _empty_metric(meta_fields: dict, strategy) -> _ResultMetric:
    meta = _Metadata(**meta_fields)
    meta.sync = _Sync(_should=True, fn=strategy.reduce, _group=None, rank_zero_only=False)
    metric = _ResultMetric(meta, is_tensor=True).to(strategy.root_device)
    metric.has_reset = False
    return metric
