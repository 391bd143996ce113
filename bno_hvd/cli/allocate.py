"""``bno-hvd allocate`` (offline, from a metrics file) and ``bno-hvd probe`` (under horovodrun)."""

from __future__ import annotations

import json
import time

import click

from bno_hvd.allocation import STRATEGY_NAMES, make_strategy
from bno_hvd.allocation.metrics_file import load_metrics_file, metrics_to_json
from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import CAP, RANKS, parse_int_list, show_value


@click.command()
@click.option(
    "--metrics",
    "metrics_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="JSON with ops (per rank), memory_used (bytes) and latency (NxN seconds).",
)
@click.option(
    "--strategy", type=click.Choice(STRATEGY_NAMES), default="bno", show_default=True, help="Allocation strategy."
)
@click.option("--base-batch-size", type=int, default=32, show_default=True, help="Baseline batch size B.")
@click.option("--global-batch", type=int, default=None, help="Global batch for strategies that keep it fixed.")
@click.option("--batch-sizes", default=None, help="For --strategy fixed.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed (random strategy).")
def allocate(metrics_path, strategy, base_batch_size, global_batch, batch_sizes, seed):
    """Compute an allocation offline and print JSON {"batch_sizes": [...]}."""
    if base_batch_size < 1:
        raise UsageError(f"--base-batch-size must be a positive integer, got {base_batch_size}")
    metrics = load_metrics_file(metrics_path)
    t0 = time.perf_counter()
    strat = make_strategy(
        strategy,
        metrics.n,
        base_batch_size,
        global_batch=global_batch,
        seed=seed,
        batch_sizes=list(parse_int_list(batch_sizes, "--batch-sizes") or []) or None,
    )
    sizes = strat.rebalance(metrics, strat.initial(), 0)
    seconds = time.perf_counter() - t0
    click.echo(
        json.dumps(
            {
                "batch_sizes": [int(b) for b in sizes],
                "strategy": strategy,
                "ranks": metrics.n,
                "seconds": round(seconds, 6),
            }
        )
    )


@click.command()
@click.option("--steps", type=int, default=20, show_default=True, help="Forward+backward steps to time per rank.")
@click.option("--batch-size", type=int, default=32, show_default=True, help="Batch size of the timed steps.")
@click.option("--model", default="cnn", show_default=True, help="Model whose steps are timed (as train's --model).")
@click.option("--probe-bytes", type=int, default=65536, show_default=True, help="Ping-pong payload.")
@click.option("--repeats", type=int, default=5, show_default=True, help="Ping-pongs per pair and direction.")
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the metrics JSON that `bno-hvd allocate --metrics` reads.",
)
@click.option(
    "--max-rounds",
    type=int,
    default=None,
    help="Probe only this many pairing rounds (sampled pairs, constant cost per rank); default all N-1.",
)
@click.option("--threads", type=int, default=1, show_default=True, help="torch threads per rank.")
def probe(steps, batch_size, model, probe_bytes, repeats, out_path, max_rounds, threads):
    """Measure OPS, memory and the latency matrix on every rank (under horovodrun)."""
    check_probe_flags(steps, batch_size, probe_bytes, repeats, max_rounds, threads)
    # torch and MPI load only here (the CLI itself starts in a tenth of a second)
    import torch
    from mpi4py import MPI

    from bno_hvd.common.atomic import write_json_atomic
    from bno_hvd.data.models import build_model
    from bno_hvd.library.control.probe import probe_cluster

    comm = MPI.COMM_WORLD.Dup()
    torch.set_num_threads(threads)
    torch.manual_seed(comm.Get_rank())
    metrics, seconds = probe_cluster(
        comm,
        build_model(model),
        batch_size=batch_size,
        steps=steps,
        probe_bytes=probe_bytes,
        repeats=repeats,
        max_rounds=max_rounds,
    )
    if metrics is not None:
        click.echo(f"{'rank':>4} {'ops (samples/s)':>16} {'memory (MiB)':>13} {'probe (ms)':>11}")
        for r in range(metrics.n):
            click.echo(
                f"{r:>4} {metrics.ops[r]:>16.1f} {metrics.memory_used[r] / 2**20:>13.1f} {seconds[r] * 1e3:>11.2f}"
            )
        click.echo(f"latency matrix NL_ij (ms), {probe_bytes}-byte ping-pong, median of {repeats}:")
        for row in metrics.latency:
            click.echo("  " + " ".join(f"{v * 1e3:8.3f}" for v in row))
        if out_path:
            write_json_atomic(out_path, metrics_to_json(metrics))
            click.echo(f"wrote {out_path}")
    comm.Barrier()


def check_probe_flags(steps, batch_size, probe_bytes, repeats, max_rounds, threads) -> None:
    """``bno-hvd probe``'s flags, before MPI starts: each within what a probe can run (a payload
    of 10**12 bytes, or 0 torch threads, would fail on every rank after the start)."""
    bounds = [
        ("--steps", steps, 1, 10**6),
        ("--batch-size", batch_size, 1, CAP.high),
        ("--probe-bytes", probe_bytes, 8, 2**30),
        ("--repeats", repeats, 1, 10**4),
        ("--threads", threads, 1, 256),
    ]
    if max_rounds is not None:
        bounds.append(("--max-rounds", max_rounds, 1, RANKS.high))
    for flag, value, low, high in bounds:
        if not low <= value <= high:
            raise UsageError(f"{flag} must be between {low} and {high}, got {show_value(value)}")


COMMANDS = [allocate, probe]
