"""The training loop, run by every rank under horovodrun/mpirun/srun.

Per update: this rank's batch (its slice of the global batch, from the DataLoader), forward,
loss weighted by the rank's share of the global batch, backward; Horovod sums the gradients
(``op=Sum``), so the step is the one a single process would take on the whole global batch;
then measure, and every K updates rebalance through rank 0. Everything around the loop is built
in :mod:`bno_hvd.training.components`; optional behaviour (emulation, faults, CPU quotas, TensorBoard)
comes in as hooks (:mod:`bno_hvd.training.hooks`).
"""

from __future__ import annotations

import math
import os
import sys
import time

from bno_hvd.common.atomic import write_json_atomic
from bno_hvd.common.errors import TrainingError
from bno_hvd.library.catchup import CatchUp
from bno_hvd.processes.collectives import (
    LossSum,
    allreduce_alone,
    optimizer_step,
    set_passes,
    submit_gradients,
    wait_for_allreduce,
)
from bno_hvd.processes.collector import hold_setup, release_setup
from bno_hvd.training.checkpoint import save_training_state
from bno_hvd.training.components import Run, build_run, save_model
from bno_hvd.training.results import RunResult, UpdateRecord, steps_to_json, where_time_went
from bno_hvd.training.stopwatch import Stopwatch


def run_training(cfg, world, *, out=sys.stdout, plugin=None) -> RunResult:
    """Train per ``cfg`` on every rank of ``world`` (:func:`bno_hvd.processes.world.init_world`);
    ``plugin`` adds behaviour from outside the training application (:mod:`bno_hvd.training.hooks`)."""
    training = Training(cfg, world, out=out, plugin=plugin)
    try:
        training.advance()
    except BaseException:
        training.close()
        raise
    return training.finish()


class Training:
    """One run, stepped: :meth:`advance` trains more updates, :meth:`finish` ends it (collective).

    ``run_training`` advances it to the end at once; ``bno-hvd bench --rounds`` interleaves
    several, one block of updates at a time, with :meth:`suspend` / :meth:`resume` around each
    block (the clock stops and the hooks step aside, e.g. a CPU quota's cgroup, while other runs train).
    """

    def __init__(self, cfg, world, *, out=sys.stdout, plugin=None, restore=None, extra_hooks=()):
        self.cfg, self.world, self.out = cfg, world, out
        self.run = build_run(cfg, world, plugin, restore, extra_hooks)  # (both: --elastic, training/elastic.py)
        self.clock, self.records, self.steps, self.evals = Stopwatch(), [], [], []
        self.sit_out = CatchUp(world, self.run.model, self.run.optimizer, self.run.scaler)
        try:
            self.run.hooks.start(self.run)
            # under the run's quotas
            self.alone = allreduce_alone(world.hvd, self.run.model) if cfg.measure_allreduce else None
            self.batches = self.run.balancer.batches(self.run.loader, cfg.updates)  # epoch after epoch
        except BaseException:
            self.run.close()
            raise
        hold_setup()  # the setup's objects stay out of the collections while it trains
        self.holds = True

    @property
    def updates_done(self) -> int:
        return self.run.balancer.update

    def advance(self, updates: int | None = None) -> list[UpdateRecord]:
        """Train ``updates`` more updates (None: to the end); rank 0's records of them."""
        first, done = len(self.records), 0
        if updates is not None and updates <= 0:
            return []
        for batch in self.batches:
            self.update(batch)
            done += 1
            if updates is not None and done >= updates:
                break
        return self.records[first:]

    def update(self, batch) -> None:
        """One update of this rank, from its batch (every rank, collectively)."""
        run, cfg, world = self.run, self.cfg, self.world
        hvd, model, opt, bal, hooks = world.hvd, run.model, run.optimizer, run.balancer, run.hooks
        # -- this rank's step: forward, weighted loss, backward ------------------------
        t = time.perf_counter()
        if self.sit_out.begin(bal.batch_sizes):  # a state sent or received, or a new process set made:
            bal.timer.done(catch_up=time.perf_counter() - t)  # logged apart from the step
        step = bal.start_step(batch)  # checks the batch; weight = n_rank / sum(n)
        computes = step.size > 0  # a rank with 0 samples sits this update out
        hooks.before_compute(step)
        lr = set_lr(opt, run.lr())
        loss = 0.0
        if computes:
            opt.zero_grad()
            set_passes(opt, step.micro_batches)  # more than one above this rank's memory cap
            for inputs, targets, share in run.parts(step, batch.data):  # micro-batches: gradients accumulate
                with run.device.autocast():
                    part_loss = hooks.loss(run.task.loss(model, inputs, targets), step)
                run.backward(part_loss * step.weight * share)  # Horovod sums gradients after the last part
                loss = loss + part_loss.detach() * share
        hooks.after_compute(step)
        bal.end_compute()

        # -- gradient allreduce (Horovod, op=Sum) and the update --------------------------
        loss_sum = None
        if computes:
            submit_gradients(opt)
            loss_sum = LossSum(hvd, loss * step.weight, self.sit_out.process_set)
            wait_for_allreduce(hvd, opt, [loss_sum.handle])
            optimizer_step(opt, run.scaler)
        stats = bal.end_step()  # every K updates: rebalance via rank 0

        # -- measure and log ------------------------------------------------------------
        global_loss = loss_sum.value() if loss_sum else math.nan  # (rank 0 always computes)
        if loss_sum and not math.isfinite(global_loss):
            raise TrainingError(
                f"loss became {global_loss} at update {step.update}; lower --lr "
                "(the last good checkpoint, if any, is kept)"
            )
        self.steps.append(stats.rank_step(step.size, step.micro_batches, step.tokens or 0))
        record = None
        if world.master:
            record = make_record(step, stats, global_loss, lr, self.clock, world.size * cfg.base_batch_size)
            self.records.append(record)
            run.log.write(record)
            run.progress.update(record)
            for warning in bal.warnings.drain():
                print(f"bno-hvd: warning: {warning}", file=sys.stderr, flush=True)
        hooks.after_update(record, stats)

        # -- evaluate, checkpoint ---------------------------------------------------------
        if cfg.eval_every and run.data.test is not None and bal.update % cfg.eval_every == 0:
            self.sit_out.catch_up()  # every rank evaluates its part with the current model
            self.evals.append(evaluation_point(run, sum(r.global_batch for r in self.records), self.clock))
        if cfg.checkpoint_every and bal.update % cfg.checkpoint_every == 0:
            self.sit_out.catch_up()  # the finite check runs on every rank's parameters
            save_training_state(cfg, world.control_comm, run.model, opt, bal, run.ledger)

    def suspend(self) -> None:
        """Step aside while other runs train: the clock stops, the hooks let go."""
        self.clock.stop()
        self.run.hooks.suspend()

    def resume(self) -> None:
        self.run.hooks.resume()
        self.clock.go()
        self.run.balancer.timer.done()  # the next step's gap starts now, not when this run stepped aside

    def finish(self) -> RunResult:
        """After the last update (collective): results, then everything is closed."""
        try:
            self.sit_out.catch_up()  # the final score is every rank's, with the final model
            return finish(self.run, self.clock, self.records, self.steps, self.evals, self.out, self.alone)
        finally:
            self.close()

    def close(self) -> None:
        """Close (without results after a failure); the setup's objects go back to the collector."""
        try:
            self.run.close()
        finally:
            if self.holds:
                self.holds = False
                release_setup()


def set_lr(optimizer, lr: float) -> float:
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def make_record(step, stats, loss: float, lr: float, clock: Stopwatch, base_global: int) -> UpdateRecord:
    """Rank 0's record of the update just finished (the weight-update time is its full cycle)."""
    cycle = clock.lap()
    return UpdateRecord(
        update=step.update,
        batch_sizes=step.batch_sizes,
        weight_update_time=cycle,
        global_batch=step.global_batch,
        time=clock.elapsed(),
        loss=loss,
        samples_per_s=step.global_batch / cycle if cycle > 0 else 0.0,
        lr=lr,
        compute_time=stats.compute_seconds,
        sync_time=stats.sync_seconds,
        rebalance_time=stats.rebalance_seconds,
        gc_time=stats.gc_seconds,
        base_global_batch=base_global,
        rank_memory=stats.rank_memory,
        rebalance_note=stats.rebalance_note,
        rebalance_model=stats.rebalance_model,
        global_tokens=step.global_tokens,
        tokens_per_s=step.global_tokens / cycle if step.global_tokens and cycle > 0 else None,
    )


def evaluation_point(run: Run, samples: int, clock: Stopwatch) -> dict:
    """Test accuracy (perplexity for text) now, on the training clock (the evaluation itself is not training time)."""
    now = clock.elapsed()
    with clock.paused():
        score = run.task.score(run)
    return {"update": run.balancer.update, "samples": samples, "time": now, **score.point}


def finish(run: Run, clock: Stopwatch, records, steps, evals, out, alone=None) -> RunResult:
    """After the last update (collective): gather every rank's steps, evaluate, write results."""
    cfg, world, bal = run.cfg, run.world, run.balancer
    wall = clock.elapsed()
    rank_steps = world.control_comm.gather(steps, root=0)
    alone_by_rank = world.control_comm.gather(alone, root=0) if alone is not None else None
    warnings = run.hooks.finish(world.control_comm) + (bal.warnings.drain() if world.master else [])
    result = RunResult(
        updates=bal.update,
        wall_seconds=wall,
        samples=sum(r.global_batch for r in records),
        final_loss=records[-1].loss if records else math.nan,
        final_batch_sizes=bal.batch_sizes,
        heterogeneity=run.label,
        evals=evals,
        warnings=warnings,
        records=records,
        rank_steps=rank_steps or [],
        allreduce_alone=alone_by_rank,
        cpu_limits_outside=run.outside_limits,
        tokens=sum(r.global_tokens for r in records) if records and records[0].global_tokens else None,
    )
    if world.master and rank_steps:
        result.compute_balance, result.compute_balance_of_means, result.outside_compute_share = where_time_went(
            records, rank_steps
        )
    if run.data.test is not None:
        score = run.task.score(run)
        for name, value in score.fields.items():
            setattr(result, name, value)
        if world.master:
            done = (
                f"{result.samples} samples"
                if result.tokens is None
                else f"{result.samples} sequences, {result.tokens} tokens"
            )
            print(f"{score.line} after {bal.update} updates, {done}, {wall:.1f} s", file=out, flush=True)
    figures = (result.compute_balance, result.compute_balance_of_means, result.outside_compute_share)
    if world.master and None not in figures:
        print(
            f"compute balance {result.compute_balance:.2f} per update, {result.compute_balance_of_means:.2f} of the "
            f"ranks' means; {result.outside_compute_share:.0%} of the update outside compute; "
            f"{result.samples_per_s:.1f} samples/s"
            + (f", {result.tokens_per_s:.1f} tokens/s" if result.tokens is not None else ""),
            file=out,
            flush=True,
        )
    if world.master:
        for warning in warnings:
            print(f"bno-hvd: warning: {warning}", file=sys.stderr, flush=True)
        if cfg.save_model:
            save_model(run.model, cfg.save_model)
        if cfg.log_dir:
            write_json_atomic(os.path.join(cfg.log_dir, "result.json"), result.summary())
            write_json_atomic(os.path.join(cfg.log_dir, "ranks.json"), steps_to_json(rank_steps))
    return result
