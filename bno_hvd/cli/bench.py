"""``bno-hvd bench``: strategies one after another under the same profile, compared in one table."""

from __future__ import annotations

import click

from bno_hvd.allocation import STRATEGY_NAMES
from bno_hvd.cli.flags import config_from_flags, train_options
from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import parse_name_list
from bno_hvd.lab.benchstats import format_breakdown, format_moves, format_table

DEFAULT_STRATEGIES = "equal,balanced,bno,lbbsp,proportional,paramhub,random"


@click.command()
@train_options(exclude=("strategy",))
@click.option(
    "--strategies", default=DEFAULT_STRATEGIES, show_default=True, help="Comma-separated strategies to compare."
)
@click.option("--warmup", type=int, default=10, show_default=True, help="Updates left out of the averages.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write bench.json, bench.csv, bench.png, straggler pictures and each strategy's logs here.",
)
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on rank 0.")
def bench(strategies, warmup, out_dir, progress, **kw):
    """Compare allocation strategies in one horovodrun job (rank 0 prints the table)."""
    if kw.get("dataset") == "text":  # strategy:unit entries, tokens/s and perplexity (bno_hvd/lab/textbench.py)
        from bno_hvd.cli.bench_text import text_bench

        return text_bench(None if strategies == DEFAULT_STRATEGIES else strategies, warmup, out_dir, progress, kw)
    names = parse_name_list(strategies, "--strategies", STRATEGY_NAMES)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UsageError(f"--strategies names {','.join(repeated)} more than once; give each strategy once")
    if kw.get("batch_sizes") and "fixed" not in names:
        raise UsageError("--batch-sizes only applies to the strategy 'fixed'; add it to --strategies or drop the flag")
    # the first run's config checks every flag; --batch-sizes belongs to 'fixed' alone
    first = "fixed" if "fixed" in names else names[0]
    base = config_from_flags(strategy=first, eval=False, progress=progress, **kw)
    if warmup < 0 or warmup + 2 > base.updates:
        raise UsageError(f"--warmup {warmup} must be >= 0 and leave at least 2 of the {base.updates} updates")
    # torch, MPI and Horovod load only when a run starts (the CLI itself starts in a tenth of a second)
    from bno_hvd.lab.suites import run_bench
    from bno_hvd.runtime.world import init_world

    outcome = run_bench(
        base, names, warmup, out_dir, init_world(base.collectives), echo=lambda m: click.echo(m, err=True)
    )
    if outcome is None:  # not rank 0
        return
    click.echo(outcome.label)
    click.echo(format_table(outcome.summaries))
    click.echo("where each rank's update goes (means over the measured updates):")
    for name, rows in outcome.breakdown.items():
        click.echo(f"  {name}:")
        click.echo("\n".join("    " + line for line in format_breakdown(rows).splitlines()))
    if outcome.recovery:
        click.echo("recovery after each change (rebalance intervals to reach 90% of the new ideal; - = never):")
        for name, values in outcome.recovery.items():
            click.echo(f"  {name:<13}" + "  ".join("-" if v is None else f"{v:.1f}" for v in values))
        click.echo("... and to reach 90% of what the best strategy sustains after the change:")
        for name, values in outcome.recovery_vs_best.items():
            click.echo(f"  {name:<13}" + "  ".join("-" if v is None else f"{v:.1f}" for v in values))
    click.echo("moves (from this update on, the split; a note where it is not the fit's split):")
    for name, changes in outcome.moves.items():
        if changes:
            click.echo(f"  {name}:")
            click.echo("\n".join("    " + line for line in format_moves(changes).splitlines()))
        else:
            click.echo(f"  {name}: none")
    if out_dir:
        click.echo(f"wrote {out_dir}/bench.json, bench.csv, bench.png, stragglers_*.png")


COMMANDS = [bench]
