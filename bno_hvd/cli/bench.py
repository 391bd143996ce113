"""``bno-hvd bench``: strategies one after another under the same profile, compared in one table."""

from __future__ import annotations

import os

import click

from bno_hvd.allocation import STRATEGY_NAMES, check_spec
from bno_hvd.cli.flags import config_from_flags, train_options
from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import parse_name_list
from bno_hvd.lab.benchstats import format_breakdown, format_moves, format_table
from bno_hvd.lab.pairing import format_comparison
from bno_hvd.lab.stalls import format_stalls

DEFAULT_STRATEGIES = "equal,balanced,bno,lbbsp,proportional,paramhub,random"


@click.command()
@train_options(exclude=("strategy",))
@click.option(
    "--strategies",
    default=DEFAULT_STRATEGIES,
    show_default=True,
    help="Comma-separated strategies to compare; a strategy with options set counts as one more "
    "(balanced,balanced:sit_out=0 compares the two: an ablation).",
)
@click.option("--warmup", type=int, default=10, show_default=True, help="Updates left out of the averages.")
@click.option(
    "--rounds",
    type=int,
    default=1,
    show_default=True,
    help="1: each strategy's run after the other's. R > 1: all runs alive at once, an untimed warm-up "
    "of each, then R rounds of one block of (updates - warmup) / R updates per strategy in a new random "
    "order (from --seed); the table adds each strategy's paired ratio to equal per round: median and a "
    "bootstrap 95%% interval.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write bench.json, bench.csv, bench.png, straggler pictures and each strategy's logs here.",
)
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on rank 0.")
@click.option(
    "--suite",
    type=click.Choice(["real"]),
    default=None,
    help="Run the profile suite instead of one job (not under mpirun: it launches one 4-rank job per profile, "
    "REAL limits set by bno-hvd and outside it, a competing process, EMULATED levels; default flags of every "
    "strategy; --updates 100 --warmup 20 --rounds 4 unless given). Needs --out.",
)
@click.option(
    "--profiles",
    default=None,
    help="--suite: only these profiles (comma-separated names; outside-8-four-tiny-50ms, 8 ranks, runs only so).",
)
def bench(strategies, warmup, rounds, out_dir, progress, suite, profiles, **kw):
    """Compare allocation strategies in one horovodrun job (rank 0 prints the table)."""
    if kw.get("dataset") == "text":  # strategy:unit entries, tokens/s and perplexity (bno_hvd/lab/textbench.py)
        from bno_hvd.cli.bench_text import text_bench

        return text_bench(None if strategies == DEFAULT_STRATEGIES else strategies, warmup, out_dir, progress, kw)
    if suite or profiles:
        return run_suite_command(strategies, warmup, rounds, out_dir, profiles)
    names = parse_strategies(strategies)
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
    if rounds < 1 or (rounds > 1 and (base.updates - warmup) // rounds < 2):
        raise UsageError(
            f"--rounds {rounds} must be >= 1, and each round needs a block of at least 2 updates: "
            f"(--updates {base.updates} - --warmup {warmup}) / --rounds is {(base.updates - warmup) // max(rounds, 1)}"
        )
    # torch, MPI and Horovod load only when a run starts (the CLI itself starts in a tenth of a second)
    from bno_hvd.lab.suites import run_bench
    from bno_hvd.processes.world import init_world

    world = init_world(**base.world_options())
    outcome = run_bench(base, names, warmup, out_dir, world, echo=lambda m: click.echo(m, err=True), rounds=rounds)
    if outcome is not None:  # rank 0
        print_outcome(outcome, rounds, out_dir)


def print_outcome(outcome, rounds: int, out_dir) -> None:
    """Rank 0: the table, the paired comparison, where each rank's update goes, recovery, moves."""
    click.echo(outcome.label)
    click.echo(format_table(outcome.summaries))
    if outcome.paired:
        click.echo(f"paired per round ({rounds} rounds, random order each; ratio of samples/s in the same round):")
        click.echo(format_comparison(outcome.paired, outcome.baseline))
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
    click.echo("stalls (timed updates over 2x their 20 neighbours' median, and what the logs say held them up):")
    for name, stalls in outcome.stalls.items():
        click.echo(f"  {name}: {format_stalls(stalls)}")
    if out_dir:
        click.echo(f"wrote {out_dir}/bench.json, bench.csv, bench.png, stragglers_*.png")


COMMANDS = [bench]


SUITE_DEFAULTS = {"updates": 100, "warmup": 20, "rounds": 4}


def run_suite_command(strategies, warmup, rounds, out_dir, profiles) -> None:
    """``bench --suite real``: the driver, outside MPI (lab/profiles.py)."""
    from bno_hvd.cli.launching import mpirun_command
    from bno_hvd.lab import profiles as suite
    from bno_hvd.lab import suitetable
    from bno_hvd.processes.world import launched_rank

    ctx = click.get_current_context()
    if os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("PMI_SIZE") or launched_rank() != 0:
        raise UsageError(
            "--suite launches its own mpirun jobs: run 'bno-hvd bench --suite real --out DIR' without mpirun"
        )
    if not out_dir:
        raise UsageError("--suite needs --out DIR (one directory per profile, suite.json and suite.md)")
    given = {k for k in SUITE_DEFAULTS if ctx.get_parameter_source(k) != click.core.ParameterSource.DEFAULT}
    values = {"updates": ctx.params["updates"], "warmup": warmup, "rounds": rounds}
    values = {k: (values[k] if k in given else v) for k, v in SUITE_DEFAULTS.items()}
    names = (
        list(suitetable.STRATEGIES)
        if ctx.get_parameter_source("strategies") == click.core.ParameterSource.DEFAULT
        else parse_strategies(strategies)
    )
    chosen = suite.PROFILES
    if profiles:
        chosen = [suite.BY_NAME[n] for n in parse_name_list(profiles, "--profiles", list(suite.BY_NAME))]
    if (values["updates"] - values["warmup"]) // values["rounds"] < 2:
        raise UsageError("--suite: (--updates - --warmup) / --rounds must leave blocks of at least 2 updates")
    os.makedirs(out_dir, exist_ok=True)
    echo = lambda m: click.echo(m, err=True)  # noqa: E731
    engine = ("--engine", ctx.params["engine"])  # every profile's job runs on the engine asked for
    rows = suite.run_suite(
        chosen, out_dir, values["rounds"], values["updates"], values["warmup"], names, mpirun_command, echo, engine
    )
    click.echo(suitetable.suite_markdown(rows), nl=False)
    click.echo(f"wrote {out_dir}/suite.json, suite.md and one directory per profile")
    if any("error" in r for r in rows):
        raise SystemExit(1)


def parse_strategies(text: str) -> list[str]:
    """``--strategies``: names or specs (``balanced:sit_out=0``), each checked in one line."""
    specs = [s.strip() for s in str(text).split(",") if s.strip()]
    if not specs:
        raise UsageError(f"--strategies {text!r}: empty list; choose from {','.join(STRATEGY_NAMES)}")
    try:
        return [check_spec(spec) for spec in specs]
    except UsageError as err:
        raise UsageError(f"--strategies {text!r}: {err}") from None
