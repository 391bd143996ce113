"""Everything a training run needs, built from its :class:`~bno_hvd.training.config.TrainConfig`.

:func:`prepare` checks what a user can get wrong (flags, data, model, output paths) without
starting MPI, so ``bno-hvd train --dry-run`` runs it alone. :func:`build_run` does it on every
rank, agrees on the outcome before the first collective (a mistake on one rank ends every rank
with the same message), then starts the monitor, the balancer and the loader, wraps the optimizer
for Horovod, restores a checkpoint and opens the logs. :mod:`bno_hvd.training.loop` only runs the loop.
"""

from __future__ import annotations

import os
import random
import socket
import sys
from dataclasses import dataclass

import numpy as np
import torch

from bno_hvd.allocation import make_strategy, split_spec
from bno_hvd.allocation.weighting import scaled_lr
from bno_hvd.common.atomic import atomic_write
from bno_hvd.common.errors import UsageError
from bno_hvd.data.images import Datasets
from bno_hvd.library.balancer import Balancer
from bno_hvd.library.control.monitor import MetricsMonitor
from bno_hvd.library.exact import exact_for_run
from bno_hvd.library.step import TextOptions
from bno_hvd.processes.cpulimit import cpu_limit
from bno_hvd.processes.device import Device, measure_cap
from bno_hvd.training.checkpoint import restore_training_state
from bno_hvd.training.config import TrainConfig
from bno_hvd.training.hooks import Hooks, Plugin
from bno_hvd.training.ledger import Ledger
from bno_hvd.training.runlog import Progress, UpdateLog, check_output_paths
from bno_hvd.training.tasks import ImageTask, make_task
from bno_hvd.training.tensorboard import TensorBoardHook, check_tensorboard


@dataclass
class Prepared:
    """What :func:`prepare` checked and built (nothing collective yet)."""

    data: Datasets
    device: Device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    strategy: object
    plugin: Plugin  # what the caller added (the lab's emulated speeds, real CPU quotas, faults)
    cap: int | None  # this rank's memory cap (samples per forward/backward pass)
    task: object = None  # bno_hvd.training.tasks: images or text
    notes: tuple = ()  # what the data said for the user (rank 0 prints them once)


def prepare(cfg: TrainConfig, rank: int, size: int, local_rank: int = 0, plugin=None) -> Prepared:
    """Data, model, optimizer, strategy and the plugin for ``size`` ranks; :class:`UsageError` on bad input.

    ``plugin``: a factory ``plugin(cfg, size) -> Plugin`` (see :mod:`bno_hvd.training.hooks`), or None
    for a plain run, which refuses the flags only a plugin serves."""
    cfg.check_world(size)
    built = make_plugin(cfg, size, plugin)
    task = make_task(cfg)
    data, notes = task.load(cfg)
    base, global_batch = task.strategy_units(cfg, data, size)  # samples, or shares of work (text)
    strategy = make_strategy(
        cfg.strategy,
        size,
        base,
        global_batch=global_batch,
        seed=cfg.seed,
        batch_sizes=list(cfg.batch_sizes) if cfg.batch_sizes else None,
        **elastic_options(cfg),
    )
    if rank == 0:  # only rank 0 writes; fail before training, not at the first checkpoint
        check_output_paths(cfg.log_dir, cfg.checkpoint_dir, cfg.save_model, cfg.tensorboard)
        if cfg.tensorboard:
            check_tensorboard()
    torch.manual_seed(cfg.seed)
    model = task.build_model(cfg, data)
    device = Device.for_rank(cfg.device, local_rank, cfg.amp)
    model = model.to(device=device.torch, dtype=getattr(torch, cfg.dtype))
    cap = measure_cap(model, data.input_shape, device) if cfg.max_batch_auto else cfg.cap_of(rank)
    optimizer = (
        torch.optim.Adam(model.parameters(), lr=cfg.lr)
        if cfg.optimizer == "adam"
        else torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    )
    return Prepared(data, device, model, optimizer, strategy, built, cap, task, tuple(notes))


def elastic_options(cfg: TrainConfig) -> dict:
    """``--elastic`` keeps the global batch while the ranks change: ``equal`` splits it evenly."""
    return {"even": True} if cfg.elastic and split_spec(cfg.strategy)[0] == "equal" else {}


def make_plugin(cfg: TrainConfig, size: int, factory=None) -> Plugin:
    """The plugin ``factory`` builds for this run; without one, a plain run (flags that need one refused)."""
    if factory is not None:
        return factory(cfg, size)
    needs = cfg.plugin_flags()
    if needs:
        raise UsageError(
            f"{needs[0]} needs the lab's plugin: run it through bno-hvd train/bench/experiment, or pass "
            "plugin=bno_hvd.lab.plugin.lab_plugin to run_training"
        )
    return Plugin()


def build_hooks(cfg: TrainConfig, prepared: Prepared, rank: int) -> Hooks:
    """The optional behaviour this run asks for: the plugin's hooks, then TensorBoard (none for a plain run)."""
    hooks = prepared.plugin.hooks(rank)
    if cfg.tensorboard:
        hooks.append(TensorBoardHook(cfg.tensorboard, rank))
    return Hooks(hooks)


@dataclass
class Run:
    """One training run on one rank: the pieces the loop in :mod:`bno_hvd.training.loop` uses."""

    cfg: TrainConfig
    world: object  # bno_hvd.processes.world.World
    data: Datasets
    device: Device
    model: torch.nn.Module
    optimizer: object  # hvd.DistributedOptimizer
    strategy: object
    balancer: Balancer
    loader: object  # torch DataLoader of this rank's batches
    monitor: MetricsMonitor
    hooks: Hooks
    log: UpdateLog
    progress: Progress
    heterogeneity: dict  # what makes the ranks differ (the plugin's description, run.json's "heterogeneity")
    label: str  # its one line: EMULATED, REAL, or neither
    resumed_from: int | None = None
    scaler: object = None  # a GradScaler with --amp on a GPU
    outside_limits: list | None = None  # per rank: the CPU limit its cgroup had at the start (None: none)
    task: object = ImageTask()  # bno_hvd.training.tasks: how batches reach the model, the loss, the score
    ledger: Ledger | None = None  # the stream ranges of every committed update (bno_hvd.training.ledger)

    def __post_init__(self) -> None:
        self.scaler = self.device.grad_scaler()

    def lr(self) -> float:
        """The learning rate of the next update (follows the global batch where a strategy changes it)."""
        rule = self.cfg.lr_scaling if self.strategy.changes_global_batch else "none"
        return scaled_lr(self.cfg.lr, self.balancer.global_batch, self.world.size, self.cfg.base_batch_size, rule)

    def backward(self, loss) -> None:
        """``loss.backward()``, through the GradScaler with ``--amp`` on a GPU."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def parts(self, step, data):
        """``(inputs, targets, share)`` per micro-batch of this rank's batch, on the model's device."""
        return self.task.parts(step, data, self.device.torch, getattr(torch, self.cfg.dtype))

    def close(self) -> None:
        try:
            self.log.close()
            self.progress.close()
            self.monitor.stop()
        finally:
            self.hooks.close()


def build_run(cfg: TrainConfig, world, plugin=None, restore=None, extra_hooks=()) -> Run:
    """Collective: everything :func:`bno_hvd.training.loop.run_training` needs, on every rank
    (``plugin``: as :func:`prepare` takes it). ``restore(model, optimizer, balancer, ledger)``, when
    given, restores the state instead of ``--resume``'s checkpoint (``--elastic``: a re-formed job
    takes its state from a rank that holds it) and returns its update; ``extra_hooks`` come last."""
    torch.set_num_threads(cfg.threads)
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)
    error, prepared = None, None
    try:
        prepared = prepare(cfg, world.rank, world.size, world.local_rank, plugin)
    except UsageError as err:
        error = str(err)
    errors = world.control_comm.allgather(error)
    if any(errors):
        bad = [r for r, e in enumerate(errors) if e]
        first = errors[bad[0]]
        raise UsageError(first if len(bad) == world.size else f"rank(s) {bad}: {first}")

    hvd = world.hvd
    ledger = Ledger(
        cfg.log_dir if world.rank == 0 else None,
        dataset_len=len(prepared.data.train),
        seed=cfg.seed,
        members=getattr(world, "members", None),
    )
    hooks = build_hooks(cfg, prepared, world.rank)
    hooks.hooks += [ledger, *extra_hooks]
    # text: the cost of a sequence, measured before Horovod wraps the optimizer (no allreduce in it)
    split, cost_model = prepared.task.allocation(cfg, world.control_comm, prepared.model, prepared.data, world.size)
    monitor = MetricsMonitor(
        world.monitor_comm,
        device=prepared.device.name,
        latency_interval=cfg.latency_interval,
        payload_bytes=cfg.probe_bytes,
        rank=world.rank,  # (the latency row's length where there is no monitor communicator: torchrun)
        size=world.size,
    ).start()
    try:
        balancer = Balancer(
            world.control_comm,
            prepared.strategy,
            len(prepared.data.train),
            seed=cfg.seed,
            rebalance_every=cfg.rebalance_every,
            monitor=monitor,
            max_batch=prepared.cap,
            lag=cfg.allocation_lag,
            report_filter=hooks.report,
            sync=prepared.device.synchronize,
            # images: a rank may sit an update out (the loop leaves it out of the allreduce); not
            # yet for text, whose batches are split by tokens or work
            sit_out=getattr(world, "sit_out_sets", None) is not None and not split,
            text=TextOptions(max_tokens=cfg.token_cap_of(world.rank), **split) if split else None,
        )
        batchnorm_note = exact_for_run(
            prepared.model,
            balancer,
            enabled=cfg.exact_batchnorm,
            capped=cfg.max_batch is not None or cfg.max_batch_auto or cfg.max_tokens is not None,
            process_sets=getattr(world, "sit_out_sets", None),
        )
        # Wrap first: DistributedOptimizer is a new optimizer object with empty state, so a
        # checkpoint's momentum/Adam moments must be loaded into (and broadcast from) the wrapper.
        optimizer = hvd.DistributedOptimizer(
            prepared.optimizer, named_parameters=prepared.model.named_parameters(), op=hvd.Sum
        )
        model = prepared.model
        if restore is not None:
            resumed_from = restore(model, optimizer, balancer, ledger)
        elif cfg.resume:
            resumed_from = restore_training_state(cfg, world.control_comm, model, optimizer, balancer, ledger)
        else:
            resumed_from = None
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        if resumed_from is not None:
            # only then: on fresh state Horovod's broadcast takes a zero-gradient step that would
            # start Adam's step count at 1
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        loader = balancer.loader(
            prepared.data.train,
            num_workers=cfg.num_workers,
            prefetch_factor=cfg.prefetch_factor,
            pin_memory=cfg.pin_memory or prepared.device.is_cuda,
            persistent_workers=cfg.num_workers > 0,
            **({"collate_fn": prepared.task.collate} if prepared.task.collate else {}),
        )
    except BaseException:
        monitor.stop()
        hooks.close()
        raise
    description = prepared.plugin.description
    # before the run's hooks start (a --cpu-quota group is joined then): the limits set outside
    # bno-hvd, by a container, Slurm or a shared node's cgroup
    outside = world.control_comm.allgather(cpu_limit())
    meta = {
        "config": cfg.to_dict(),
        "world_size": world.size,
        "hosts": world.control_comm.allgather(socket.gethostname()),
        "heterogeneity": description,
        "label": prepared.plugin.label,
        "allocation_lag": balancer.plan.lag,
        "notes": world.notes,
        "collectives": world.collectives,  # what --collectives auto resolved to (gloo/nccl: --engine torch)
        "resumed_from": resumed_from,
        "cpu_limits_outside": outside,
        "allocation_unit": cfg.allocation_unit,
        **({"cost_model": cost_model} if cost_model else {}),
    }
    master = world.rank == 0
    if master:
        for note in prepared.notes + ((batchnorm_note,) if batchnorm_note else ()):
            print(f"bno-hvd: note: {note}", file=sys.stderr, flush=True)
    log = UpdateLog(cfg.log_dir if master else None, meta, append=resumed_from is not None, keep_before=resumed_from)
    ledger.open(ledger.resumed, resumed_from)
    progress = Progress(cfg.updates, enabled=master and cfg.progress, start=balancer.update)
    return Run(
        cfg=cfg,
        world=world,
        data=prepared.data,
        device=prepared.device,
        model=model,
        optimizer=optimizer,
        strategy=prepared.strategy,
        balancer=balancer,
        loader=loader,
        monitor=monitor,
        hooks=hooks,
        log=log,
        progress=progress,
        heterogeneity=description,
        label=prepared.plugin.label,
        resumed_from=resumed_from,
        outside_limits=outside,
        task=prepared.task,
        ledger=ledger,
    )


def save_model(model, path: str) -> None:
    """The model's ``state_dict`` at ``path``, atomically."""
    atomic_write(os.path.abspath(path), lambda fh: torch.save(model.state_dict(), fh), binary=True)
