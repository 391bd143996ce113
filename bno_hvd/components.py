"""Everything a training run needs, built from its :class:`~bno_hvd.config.TrainConfig`.

:func:`prepare` checks what a user can get wrong (flags, data, model, output paths) without
starting MPI, so ``bno-hvd train --dry-run`` runs it alone. :func:`build_run` does it on every
rank, agrees on the outcome before the first collective (a mistake on one rank ends every rank
with the same message), then starts the monitor, the balancer and the loader, wraps the optimizer
for Horovod, restores a checkpoint and opens the logs. :mod:`bno_hvd.train` only runs the loop.
"""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass

import numpy as np
import torch

from . import heterogeneity
from .allocation import make_strategy
from .atomic import atomic_write
from .balancer import Balancer
from .checkpoint import restore_training_state
from .config import TrainConfig
from .control.monitor import MetricsMonitor
from .data import Datasets, load_datasets
from .emulation import DeviceEmulator, EmulationHook, check_emulated_rate, load_schedule
from .errors import UsageError
from .faults import FaultInjector
from .hooks import Hooks
from .models import build_model
from .parsing import RankSchedule
from .runlog import Progress, UpdateLog, check_output_paths
from .weighting import scaled_lr


@dataclass
class Prepared:
    """What :func:`prepare` checked and built (nothing collective yet)."""

    data: Datasets
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    strategy: object
    speeds: RankSchedule | None  # emulated device speeds, if any


def prepare(cfg: TrainConfig, rank: int, size: int) -> Prepared:
    """Data, model, optimizer, strategy and schedules for ``size`` ranks; :class:`UsageError` on bad input."""
    cfg.check_world(size)
    data = load_datasets(
        cfg.dataset,
        cfg.data_dir,
        with_test=cfg.eval,
        image_size=cfg.image_size,
        synthetic_size=cfg.synthetic_size,
        seed=cfg.seed,
    )
    strategy = make_strategy(
        cfg.strategy,
        size,
        cfg.base_batch_size,
        global_batch=cfg.global_batch,
        seed=cfg.seed,
        batch_sizes=list(cfg.batch_sizes) if cfg.batch_sizes else None,
    )
    speeds = None
    if cfg.emulate_schedule:
        speeds = load_schedule(cfg.emulate_schedule, size)
        check_emulated_rate([v for _, values in speeds.entries for v in values], cfg.emulate_rate, "--emulate-schedule")
    elif cfg.emulate_speed:
        speeds = RankSchedule.constant(cfg.emulate_speed)
    if rank == 0:  # only rank 0 writes; fail before training, not at the first checkpoint
        check_output_paths(cfg.log_dir, cfg.checkpoint_dir, cfg.save_model)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, cfg.num_classes or data.num_classes, data.input_shape)
    model = model.to(getattr(torch, cfg.dtype))
    optimizer = (
        torch.optim.Adam(model.parameters(), lr=cfg.lr)
        if cfg.optimizer == "adam"
        else torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    )
    return Prepared(data, model, optimizer, strategy, speeds)


def build_hooks(cfg: TrainConfig, prepared: Prepared, rank: int) -> Hooks:
    """The optional behaviour this run's flags ask for (none for a plain run)."""
    hooks = []
    if prepared.speeds is not None:
        hooks.append(EmulationHook(DeviceEmulator(rank, cfg.emulate_rate, prepared.speeds)))
    if cfg.inject_fault:
        hooks.append(FaultInjector.parse(cfg.inject_fault, rank))
    return Hooks(hooks)


@dataclass
class Run:
    """One training run on one rank: the pieces the loop in :mod:`bno_hvd.train` uses."""

    cfg: TrainConfig
    world: object  # bno_hvd.world.World
    data: Datasets
    model: torch.nn.Module
    optimizer: object  # hvd.DistributedOptimizer
    strategy: object
    balancer: Balancer
    loader: object  # torch DataLoader of this rank's batches
    monitor: MetricsMonitor
    hooks: Hooks
    log: UpdateLog
    progress: Progress
    heterogeneity: dict
    resumed_from: int | None = None

    def lr(self) -> float:
        """The learning rate of the next update (follows the global batch where a strategy changes it)."""
        rule = self.cfg.lr_scaling if self.strategy.changes_global_batch else "none"
        return scaled_lr(self.cfg.lr, self.balancer.global_batch, self.world.size, self.cfg.base_batch_size, rule)

    def inputs(self, data):
        """A batch's images and labels, in the model's precision."""
        x, y = data
        return x.to(getattr(torch, self.cfg.dtype)), y

    def close(self) -> None:
        try:
            self.log.close()
            self.progress.close()
            self.monitor.stop()
        finally:
            self.hooks.close()


def build_run(cfg: TrainConfig, world) -> Run:
    """Collective: everything :func:`bno_hvd.train.run_training` needs, on every rank."""
    torch.set_num_threads(cfg.threads)
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)
    error, prepared = None, None
    try:
        prepared = prepare(cfg, world.rank, world.size)
    except UsageError as err:
        error = str(err)
    errors = world.control_comm.allgather(error)
    if any(errors):
        bad = [r for r, e in enumerate(errors) if e]
        first = errors[bad[0]]
        raise UsageError(first if len(bad) == world.size else f"rank(s) {bad}: {first}")

    hvd = world.hvd
    hooks = build_hooks(cfg, prepared, world.rank)
    monitor = MetricsMonitor(
        world.monitor_comm, latency_interval=cfg.latency_interval, payload_bytes=cfg.probe_bytes
    ).start()
    try:
        balancer = Balancer(
            world.control_comm,
            prepared.strategy,
            len(prepared.data.train),
            seed=cfg.seed,
            rebalance_every=cfg.rebalance_every,
            monitor=monitor,
            max_batch=cfg.max_batch,
            lag=cfg.allocation_lag,
            report_filter=hooks.report,
        )
        # Wrap first: DistributedOptimizer is a new optimizer object with empty state, so a
        # checkpoint's momentum/Adam moments must be loaded into (and broadcast from) the wrapper.
        optimizer = hvd.DistributedOptimizer(
            prepared.optimizer, named_parameters=prepared.model.named_parameters(), op=hvd.Sum
        )
        model = prepared.model
        resumed_from = (
            restore_training_state(cfg, world.control_comm, model, optimizer, balancer) if cfg.resume else None
        )
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        if resumed_from is not None:
            # only then: on fresh state Horovod's broadcast takes a zero-gradient step that would
            # start Adam's step count at 1
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        loader = balancer.loader(
            prepared.data.train,
            num_workers=cfg.num_workers,
            prefetch_factor=cfg.prefetch_factor,
            pin_memory=cfg.pin_memory,
            persistent_workers=cfg.num_workers > 0,
        )
    except BaseException:
        monitor.stop()
        hooks.close()
        raise
    description = heterogeneity.describe(prepared.speeds, cfg.emulate_rate)
    meta = {
        "config": cfg.to_dict(),
        "world_size": world.size,
        "hosts": world.control_comm.allgather(socket.gethostname()),
        "heterogeneity": description,
        "label": heterogeneity.label(description),
        "allocation_lag": balancer.plan.lag,
        "notes": world.notes,
        "resumed_from": resumed_from,
    }
    master = world.rank == 0
    log = UpdateLog(cfg.log_dir if master else None, meta, append=resumed_from is not None, keep_before=resumed_from)
    progress = Progress(cfg.updates, enabled=master and cfg.progress, start=balancer.update)
    return Run(
        cfg,
        world,
        prepared.data,
        model,
        optimizer,
        prepared.strategy,
        balancer,
        loader,
        monitor,
        hooks,
        log,
        progress,
        description,
        resumed_from,
    )


def save_model(model, path: str) -> None:
    """The model's ``state_dict`` at ``path``, atomically."""
    atomic_write(os.path.abspath(path), lambda fh: torch.save(model.state_dict(), fh), binary=True)
