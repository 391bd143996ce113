"""Several training runs one after another in one job: ``bno-hvd bench`` (strategies side by side),
``bno-hvd experiment`` (the paper's models x strategies) and ``bno-hvd time-to-accuracy`` (whole
runs to a target accuracy, in rounds). Every rank runs this; rank 0
summarises and writes. Runs share the job's MPI world and Horovod, not their state.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field

from bno_hvd.allocation import split_spec
from bno_hvd.common.atomic import write_json_atomic
from bno_hvd.common.errors import TrainingError
from bno_hvd.lab.averages import merge_experiment
from bno_hvd.lab.benchstats import (
    BenchSummary,
    Move,
    RankBreakdown,
    best_plateaus,
    moves,
    rank_breakdown,
    recovery_intervals,
    rolling_efficiency,
    summarize,
    with_speedups,
)
from bno_hvd.lab.heterogeneity import NONE, from_config, outside_label
from bno_hvd.lab.pairing import block_rate, comparison, round_orders
from bno_hvd.lab.plugin import lab_plugin
from bno_hvd.lab.report import read_experiment_meta, run_dir, write_bench_outputs, write_experiment_report
from bno_hvd.lab.stalls import Stall, find_stalls
from bno_hvd.lab.ttastats import summarize as summarize_tta
from bno_hvd.training.loop import Training, run_training


@dataclass
class BenchOutcome:
    """Rank 0's result of a bench: the table rows, the label, recovery per strategy."""

    summaries: list[BenchSummary]
    label: str
    recovery: dict[str, list] | None = None
    changes: list[int] = field(default_factory=list)
    breakdown: dict[str, list[RankBreakdown]] = field(default_factory=dict)  # per strategy, per rank
    recovery_vs_best: dict[str, list] | None = None  # ... to 90% of the best strategy's plateau
    moves: dict[str, list[Move]] = field(default_factory=dict)  # per strategy: every change of its split
    paired: dict[str, dict] | None = None  # --rounds: per strategy, paired ratios (lab/pairing.py)
    baseline: str | None = None  # what the paired ratios divide by
    stalls: dict[str, list[Stall]] = field(default_factory=dict)  # per strategy: its stalled timed updates


def run_config(base, name: str, out_dir: str | None, **changes):
    """The config of strategy ``name``'s run in a bench."""
    return base.replace(
        strategy=name,
        batch_sizes=base.batch_sizes if split_spec(name)[0] == "fixed" else None,
        measure_allreduce=True,  # the floor of the time outside compute, under this run's profile
        log_dir=os.path.join(out_dir, "runs", name) if out_dir else None,
        tensorboard=os.path.join(base.tensorboard, name) if base.tensorboard else None,
        **changes,
    )


def run_sequential(base, names: list[str], out_dir: str | None, world, echo) -> dict:
    """One whole run per strategy, in the order given."""
    runs = {}
    for name in names:
        if world.master:
            echo(f"== {name}")
        runs[name] = run_training(run_config(base, name, out_dir), world, plugin=lab_plugin)
        gc.collect()  # free the finished run's model and optimizer before the next one
    return runs


def run_interleaved(base, names: list[str], warmup: int, rounds: int, out_dir: str | None, world, echo):
    """Every strategy's run alive at once: an untimed warm-up of each, then ``rounds`` rounds of
    one block of updates per strategy, in a new random order per round (rank 0 draws it from
    ``--seed`` and broadcasts it). Returns the results and, on rank 0, each block's samples/s."""
    block = (base.updates - warmup) // rounds
    warm = base.updates - rounds * block  # the remainder of the division warms up too
    trainings, runs = {}, {}
    try:
        for name in names:  # each with its own communicators: the runs' messages never mix
            trainings[name] = Training(run_config(base, name, out_dir, progress=False), world.fork(), plugin=lab_plugin)
            trainings[name].suspend()
        if world.master:
            echo(f"== warm-up: {warm} untimed updates of each strategy")
        for name in names:
            _block(trainings[name], warm)
        orders = world.control_comm.bcast(round_orders(names, rounds, base.seed) if world.master else None, root=0)
        rates = {name: [] for name in names}
        for number, order in enumerate(orders, 1):
            if world.master:
                echo(f"== round {number}/{rounds} ({block} updates each): {', '.join(order)}")
            for name in order:
                rates[name].append(block_rate(_block(trainings[name], block)))
        for name in names:
            trainings[name].resume()
            runs[name] = trainings.pop(name).finish()
    finally:
        for training in trainings.values():  # a failure: close what is still open
            training.close()
    return runs, rates


def _block(training, updates: int):
    training.resume()
    try:
        return training.advance(updates)
    finally:
        training.suspend()


def run_bench(
    base, names: list[str], warmup: int, out_dir: str | None, world, echo, rounds: int = 1
) -> BenchOutcome | None:
    """Train ``base`` once per strategy in ``names``, one after another (``rounds`` 1) or
    interleaved in ``rounds`` rounds; rank 0 returns the summaries (others None)."""
    paired = baseline = None
    if rounds > 1:
        runs, rates = run_interleaved(base, names, warmup, rounds, out_dir, world, echo)
        baseline = "equal" if "equal" in names else names[0]
        paired = comparison(rates, baseline, seed=base.seed) if world.master else None
    else:
        runs = run_sequential(base, names, out_dir, world, echo)
    if not world.master:
        return None
    summaries = with_speedups(
        [summarize(n, r.records, r.rank_steps, warmup, r.allreduce_alone) for n, r in runs.items()]
    )
    hetero = from_config(base, world.size)
    outside = outside_label(next(iter(runs.values())).cpu_limits_outside)  # set by a container, Slurm
    run_label = "; ".join(x for x in (hetero.label(), outside) if x and x != NONE) or NONE
    changes = [c for c in hetero.changes() if c < base.updates]  # a change after the last update is none
    recovery = relative = None
    if changes:
        every = base.rebalance_every
        eff = {n: rolling_efficiency(r.records, r.rank_steps, every) for n, r in runs.items()}
        recovery = {n: recovery_intervals(e, changes, every) for n, e in eff.items()}
        limits = [0.9 * p for p in best_plateaus(eff, changes)]
        relative = {n: recovery_intervals(e, changes, every, limits) for n, e in eff.items()}
    breakdown = {n: rank_breakdown(r.rank_steps, warmup, r.allreduce_alone) for n, r in runs.items()}
    moved = {n: moves(r.records) for n, r in runs.items()}
    stalled = {n: find_stalls(r.records, r.rank_steps, warmup) for n, r in runs.items()}
    if out_dir:
        title = f"weight-update time per update ({base.model}, {world.size} ranks)"
        records = {n: r.records for n, r in runs.items()}
        write_bench_outputs(
            out_dir,
            summaries,
            records,
            run_label,
            recovery,
            changes,
            title,
            breakdown,
            relative,
            moved,
            paired,
            stalled,
        )
    return BenchOutcome(summaries, run_label, recovery, changes, breakdown, relative, moved, paired, baseline, stalled)


def run_experiment(
    base,
    models: list[str],
    strategies: list[str],
    average_every: int,
    target: float | None,
    out_dir: str,
    world,
    command: str,
    echo,
) -> list[dict] | None:
    """Every model x strategy; rank 0 writes the report and returns its rows (others None)."""
    if world.master:
        path = os.path.join(out_dir, "experiment.json")
        write_json_atomic(
            path,
            merge_experiment(
                read_experiment_meta(path),
                {
                    "models": models,
                    "strategies": strategies,
                    "updates": base.updates,
                    "average_every": average_every,
                    "eval_every": base.eval_every,
                    "target_accuracy": target,
                    "ranks": world.size,
                    "emulation": from_config(base, world.size).label(),
                    "config": base.to_dict(),
                    "command": command,
                },
            ),
        )
    for model in models:
        for strategy in strategies:
            log_dir = run_dir(out_dir, model, strategy)
            if world.master:  # a failed run must not leave an older run's result behind
                for stale in ("result.json", "ranks.json"):
                    if os.path.exists(os.path.join(log_dir, stale)):
                        os.remove(os.path.join(log_dir, stale))
                echo(f"== {model} / {strategy}")
            try:
                tb = os.path.join(base.tensorboard, model, strategy) if base.tensorboard else None
                run_training(
                    base.replace(model=model, strategy=strategy, log_dir=log_dir, tensorboard=tb),
                    world,
                    plugin=lab_plugin,
                )
            except TrainingError as err:  # every rank sees the same global loss: all end here
                if world.master:
                    echo(f"bno-hvd: warning: {model}/{strategy} stopped: {err}")
            # Horovod's optimizer hooks keep each finished model in reference cycles; without a
            # full collection every run adds its model, gradients and momentum to the rank's RSS
            gc.collect()
    return write_experiment_report(out_dir, warn=echo) if world.master else None


def tta_config(base, name: str, **changes):
    """Strategy ``name``'s run in ``time-to-accuracy`` (no periodic evaluation of its own: the
    loop below evaluates between blocks)."""
    fixed = split_spec(name)[0] == "fixed"
    return base.replace(
        strategy=name, batch_sizes=base.batch_sizes if fixed else None, eval_every=0, progress=False, **changes
    )


def run_to_target(cfg, world, target: float, eval_every: int) -> dict:
    """One run from scratch until its first evaluation at or above ``target`` (every ``eval_every``
    updates), or ``cfg.updates``; rank 0's record of it. Each evaluation runs with the clock
    stopped and the quotas let go: it is not training, and at full speed it costs the job less."""
    training = Training(cfg, world, plugin=lab_plugin)
    evals, error = [], None
    try:
        while training.updates_done < cfg.updates:
            training.advance(min(eval_every, cfg.updates - training.updates_done))
            training.sit_out.catch_up()  # every rank scores its shard with the current model
            now = training.clock.elapsed()
            training.suspend()
            score = training.run.task.score(training.run)  # one Horovod sum: every rank sees the same
            training.resume()
            samples = sum(r.global_batch for r in training.records)
            evals.append({"update": training.updates_done, "samples": samples, "time": now, **score.point})
            if evals[-1]["accuracy"] >= target:
                break
    except TrainingError as err:  # every rank sees the same global loss: all end here, the run missed
        error = str(err)
    finally:
        done = training.updates_done
        training.close()
    hit = next((e for e in evals if e["accuracy"] >= target), None)
    return {
        "seed": cfg.seed,
        "time_to_target_s": hit["time"] if hit else None,
        "update_at_target": hit["update"] if hit else None,
        "samples_at_target": hit["samples"] if hit else None,
        "updates": done,
        "train_seconds": evals[-1]["time"] if evals else None,
        "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "final_batch_sizes": list(training.records[-1].batch_sizes) if training.records else None,
        "evals": evals,
        "error": error,
    }


def run_time_to_accuracy(base, names, target, eval_every, rounds, warmup, out_dir, world, echo) -> dict | None:
    """``bno-hvd time-to-accuracy``: an untimed warm-up run of ``warmup`` updates per strategy, then
    ``rounds`` rounds of one whole run per strategy in a new random order (rank 0 draws it from
    ``base.seed`` and broadcasts it); round k's runs (k from 1) start from seed ``base.seed + k - 1``. Rank 0
    returns the runs per strategy in round order and their summary (others None)."""
    if warmup > 0:
        if world.master:
            echo(f"== warm-up: {warmup} untimed updates of each strategy")
        for name in names:
            training = Training(tta_config(base, name, updates=warmup), world, plugin=lab_plugin)
            try:
                training.advance()
            finally:
                training.close()
            gc.collect()
    orders = world.control_comm.bcast(round_orders(names, rounds, base.seed) if world.master else None, root=0)
    runs = {name: [] for name in names}
    for number, order in enumerate(orders, 1):
        if world.master:
            echo(f"== round {number}/{rounds}: {', '.join(order)}")
        for position, name in enumerate(order):
            log_dir = os.path.join(out_dir, "runs", f"round-{number}", name)
            cfg = tta_config(base, name, seed=base.seed + number - 1, log_dir=log_dir)
            run = run_to_target(cfg, world, target, eval_every)
            runs[name].append(dict(run, round=number, position=position + 1))
            if world.master:
                t = run["time_to_target_s"]
                echo(
                    f"   {name}: "
                    + (f"{t:.1f} s to {target:.0%}" if t is not None else f"not reached in {run['updates']} updates")
                    + (f" (accuracy {run['final_accuracy']:.4f} at update {run['updates']})" if run["evals"] else "")
                    + (f"; stopped: {run['error']}" if run["error"] else "")
                )
            gc.collect()  # free the finished run's model and optimizer before the next one
    if not world.master:
        return None
    baseline = "equal" if "equal" in names else names[0]
    return {"runs": runs, "summary": summarize_tta(runs, baseline), "baseline": baseline, "orders": orders}
