"""The training loop under horovodrun/mpirun: the only module (with ``bno_hvd.control``)
that talks to Horovod or MPI.

Reads top to bottom: set up Horovod and the control plane, build data/model/optimizer,
then per update: take this rank's slice, forward, weighted loss, backward, allreduce (Sum),
step, measure, and every K updates rebalance through rank 0.
"""
from __future__ import annotations

import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from .allocation import make_strategy
from .balancer import Balancer
from .checkpoint import restore_training_state, save_training_state
from .config import TrainConfig
from .control.monitor import MetricsMonitor
from .data import load_dataset
from .emulation import DeviceEmulator, load_schedule
from .errors import TrainingError, UsageError
from .faults import FaultInjector
from .models import build_model
from .runlog import Progress, UpdateLog, check_output_paths, write_json_atomic
from .weighting import scaled_lr


def init_horovod():
    """Initialise MPI (thread-multiple, for the monitor thread) and Horovod; return hvd and
    two communicators reserved for the control plane and the latency monitor."""
    from mpi4py import MPI  # noqa: F401 - initialise MPI with MPI_THREAD_MULTIPLE first
    import horovod.torch as hvd

    hvd.init()
    world = MPI.COMM_WORLD
    if world.Get_size() != hvd.size():
        raise UsageError(f"mpi4py sees {world.Get_size()} ranks but Horovod sees {hvd.size()}; "
                         "launch with horovodrun --mpi (not --gloo) or mpirun")
    return hvd, world.Dup(), world.Dup()


def make_optimizer(cfg: TrainConfig, model, lr: float):
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=cfg.momentum)


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def evaluate(hvd, model, data, rank: int, size: int, batch_size: int) -> tuple[int, int]:
    """Correct predictions and total over the test split, each rank scoring a shard."""
    x, y = data.tensors
    model.eval()
    correct = torch.zeros(1, dtype=torch.float64)
    with torch.no_grad():
        for start in range(rank * batch_size, len(y), size * batch_size):
            logits = model(x[start:start + batch_size].to(next(model.parameters()).dtype))
            correct += (logits.argmax(1) == y[start:start + batch_size]).sum()
    model.train()
    correct = hvd.allreduce(correct, op=hvd.Sum, name="eval.correct")
    return int(correct.item()), len(y)


def prepare(cfg: TrainConfig, rank: int, size: int):
    """Data, strategy, emulation, model and optimizer; raises UsageError on bad input."""
    train = load_dataset(cfg.dataset, "train", cfg.data_dir, synthetic_size=cfg.synthetic_size, seed=cfg.seed)
    test = load_dataset(cfg.dataset, "test", cfg.data_dir, synthetic_size=cfg.synthetic_size, seed=cfg.seed) if cfg.eval else None

    strategy = make_strategy(cfg.strategy, size, cfg.base_batch_size, global_batch=cfg.global_batch,
                             seed=cfg.seed, batch_sizes=list(cfg.batch_sizes) if cfg.batch_sizes else None)
    schedule = None
    if cfg.emulate_schedule:
        schedule = load_schedule(cfg.emulate_schedule, size)
    elif cfg.emulate_speed:
        schedule = [(0, list(cfg.emulate_speed))]
    emulator = DeviceEmulator(rank, cfg.emulate_rate, schedule) if schedule else None

    if rank == 0:  # only rank 0 writes; fail before training, not at the first checkpoint
        check_output_paths(cfg.log_dir, cfg.checkpoint_dir, cfg.save_model)
    model = build_model(cfg.model).to(getattr(torch, cfg.dtype))
    optimizer = make_optimizer(cfg, model, cfg.lr)
    return train, test, strategy, schedule, emulator, model, optimizer


def run_training(cfg: TrainConfig, hvd, control_comm, monitor_comm, *, out=sys.stdout) -> dict:
    """Train per ``cfg``; returns rank 0's summary (other ranks get the same keys)."""
    rank, size = hvd.rank(), hvd.size()
    master = rank == 0
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)

    # Everything a user can get wrong is checked before the first collective; the ranks then
    # agree on the outcome, so a mistake on one rank ends every rank with the same message.
    error = None
    try:
        cfg.check_world(size)
        prep = prepare(cfg, rank, size)
    except UsageError as err:
        error = str(err)
    errors = control_comm.allgather(error)
    if any(errors):
        bad = [r for r, e in enumerate(errors) if e]
        first = errors[bad[0]]
        raise UsageError(first if len(bad) == size else f"rank(s) {bad}: {first}")
    train, test, strategy, schedule, emulator, model, optimizer = prep
    x_train, y_train = train.tensors
    dtype = getattr(torch, cfg.dtype)
    monitor = MetricsMonitor(monitor_comm, latency_interval=cfg.latency_interval,
                             payload_bytes=cfg.probe_bytes).start()
    balancer = Balancer(control_comm, strategy, len(y_train), seed=cfg.seed,
                        rebalance_every=cfg.rebalance_every, monitor=monitor, emulator=emulator,
                        max_batch=cfg.max_batch)
    faults = FaultInjector.parse(cfg.inject_fault, rank).attach(balancer)  # no-op unless --inject-fault

    # Wrap first: DistributedOptimizer is a new optimizer object with empty state, so a
    # checkpoint's momentum/Adam moments must be loaded into (and broadcast from) the wrapper.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Sum)
    resumed_from = None
    if cfg.resume:
        resumed_from = restore_training_state(cfg, control_comm, model, optimizer, balancer)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if resumed_from is not None:
        # only then: on fresh state Horovod's broadcast takes a zero-gradient step that would
        # start Adam's step count at 1
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    meta = {"config": cfg.to_dict(), "world_size": size, "hosts": _hostnames(control_comm),
            "emulation": ({"label": "EMULATED heterogeneity", "schedule": schedule, "rate": cfg.emulate_rate}
                          if schedule else None), "resumed_from": resumed_from}
    log = UpdateLog(cfg.log_dir if master else None, meta, append=resumed_from is not None,
                    keep_before=resumed_from)
    progress = Progress(cfg.updates, enabled=master and cfg.progress)
    base_global = size * cfg.base_batch_size
    t_start, samples_done, last_loss = time.perf_counter(), 0, float("nan")
    own_steps: list[tuple[int, float, float]] = []  # (batch, compute s, rebalance s) of this rank
    t_prev = t_start
    records: list[dict] = []
    evals: list[dict] = []  # periodic test accuracy (--eval-every), on the training clock
    try:
        while balancer.update < cfg.updates:
            lr = scaled_lr(cfg.lr, balancer.global_batch, size, cfg.base_batch_size,
                           cfg.lr_scaling if strategy.changes_global_batch else "none")
            set_lr(optimizer, lr)
            step = balancer.start_step()
            faults.at_update(step.update)
            idx = torch.from_numpy(step.indices)
            optimizer.zero_grad()
            loss = faults.poison_loss(F.cross_entropy(model(x_train[idx].to(dtype)), y_train[idx]), step.update)
            (loss * step.weight).backward()
            balancer.end_compute()
            optimizer.step()
            stats = balancer.end_step()
            global_loss = hvd.allreduce(loss.detach() * step.weight, op=hvd.Sum, name="loss").item()
            if not math.isfinite(global_loss):
                raise TrainingError(f"loss became {global_loss} at update {step.update}; lower --lr "
                                    "(the last good checkpoint, if any, is kept)")
            last_loss = global_loss
            global_batch = sum(step.batch_sizes)
            samples_done += global_batch
            own_steps.append((step.batch_size, stats.compute_seconds, stats.rebalance_seconds))
            # weight-update time = one full cycle of this update as rank 0 saw it (compute,
            # allreduce, loss sync, rebalance): robust to where a slow rank spends its wait
            now = time.perf_counter()
            cycle, t_prev = now - t_prev, now
            if master:
                records.append({"update": step.update, "batch_sizes": step.batch_sizes,
                                "weight_update_time": cycle, "step_time": stats.step_seconds,
                                "compute_time": stats.compute_seconds, "loss": global_loss,
                                "samples_per_s": global_batch / cycle, "lr": lr,
                                "global_batch": global_batch, "base_global_batch": base_global,
                                "rebalance_time": stats.rebalance_seconds, "time": now - t_start,
                                "rank_memory": stats.rank_memory})
                log.write(records[-1])
                progress.update(balancer.update, global_batch, balancer.batch_sizes, global_loss)
                for w in balancer.warnings:  # the balancer reports each condition once
                    print(f"bno-hvd: warning: {w}", file=sys.stderr)
                balancer.warnings.clear()
            if cfg.eval_every and test is not None and balancer.update % cfg.eval_every == 0:
                t_eval = time.perf_counter()
                correct, total = evaluate(hvd, model, test, rank, size, cfg.eval_batch_size)
                evals.append({"update": balancer.update, "samples": samples_done,
                              "time": t_eval - t_start, "accuracy": correct / total})
                # evaluation is not training: keep it out of `time`, the wall seconds and
                # the next update's cycle, so time-to-accuracy measures training only
                spent = time.perf_counter() - t_eval
                t_start += spent
                t_prev += spent
            if cfg.checkpoint_every and balancer.update % cfg.checkpoint_every == 0:
                save_training_state(cfg, control_comm, model, optimizer, balancer)
        wall = time.perf_counter() - t_start
        result = {"updates": balancer.update, "wall_seconds": wall, "samples": samples_done,
                  "samples_per_s": samples_done / wall if wall > 0 else 0.0, "final_loss": last_loss,
                  "final_batch_sizes": balancer.batch_sizes, "emulated": schedule is not None,
                  "emulation_overruns": emulator.overruns if emulator else 0}
        # every rank's own step measurements, for benchmarks (ideal throughput, control cost)
        per_rank = control_comm.gather(own_steps, root=0)
        overruns = control_comm.gather(result["emulation_overruns"], root=0)
        if test is not None:
            correct, total = evaluate(hvd, model, test, rank, size, cfg.eval_batch_size)
            result.update(test_correct=correct, test_total=total, test_accuracy=correct / total)
            if master:
                print(f"test accuracy: {correct / total:.4f} ({correct}/{total}) after {balancer.update} "
                      f"updates, {samples_done} samples, {wall:.1f} s", file=out, flush=True)
        if cfg.eval_every:
            result["evals"] = evals
        if master and cfg.save_model:
            _save_model(model, cfg.save_model)
        if master:
            result["emulation_overruns"] = overruns
            if cfg.log_dir:
                write_json_atomic(os.path.join(cfg.log_dir, "result.json"), result)
                write_json_atomic(os.path.join(cfg.log_dir, "ranks.json"), {"rank_steps": per_rank})
        # in memory only: what benchmarks summarise (also readable back from the log dir)
        return dict(result, records=records, rank_steps=per_rank)
    finally:
        log.close()
        monitor.stop()


def _save_model(model, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(model.state_dict(), tmp)
    os.replace(tmp, path)


def _hostnames(comm) -> list[str]:
    import socket
    return comm.allgather(socket.gethostname())
