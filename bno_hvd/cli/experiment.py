"""``bno-hvd experiment``: the paper's evaluation in one horovodrun job (every model x strategy,
N weight updates each); ``bno-hvd report LOGDIR``: its CSVs and figures, redrawn from the logs.
The directory layout is described in :mod:`bno_hvd.lab.report`."""

from __future__ import annotations

import os
import sys

import click

from bno_hvd.allocation import STRATEGY_NAMES
from bno_hvd.cli.flags import config_from_flags, train_options
from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import parse_name_list, show_path
from bno_hvd.data.catalog import MODEL_NAMES

DEFAULT_MODELS = ",".join(MODEL_NAMES)
DEFAULT_STRATEGIES = "bno,equal,random,balanced"  # the paper's three, then ours


def check_experiment(updates: int, average_every: int, eval_on: bool, target: float | None, out_dir: str) -> None:
    """Flag checks that need more than one flag (TrainConfig checks the rest)."""
    if average_every < 1 or average_every > updates:
        raise UsageError(f"--average-every {average_every} must be between 1 and --updates ({updates})")
    if target is not None and not 0 < target <= 1:
        raise UsageError(f"--target-accuracy {target:g} must be a fraction in (0, 1], e.g. 0.85")
    if target is not None and not eval_on:
        raise UsageError("--target-accuracy needs the test split; drop --no-eval (and set --eval-every K)")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out {show_path(out_dir)}: cannot create it ({err.strerror})") from None


@click.command()
@train_options(exclude=("strategy", "model", "updates"))
@click.option("--models", default=DEFAULT_MODELS, show_default=True, help="Comma-separated models, run in this order.")
@click.option(
    "--strategies",
    default=DEFAULT_STRATEGIES,
    show_default=True,
    help="Comma-separated strategies (paper: bno,equal,random; ours: balanced).",
)
@click.option("--updates", type=int, default=2400, show_default=True, help="Weight updates per run (the paper: 2400).")
@click.option(
    "--average-every",
    type=int,
    default=100,
    show_default=True,
    help="Average the weight-update time over blocks of this many updates.",
)
@click.option(
    "--eval/--no-eval", "eval_on", default=True, show_default=True, help="Test accuracy at the end of each run."
)
@click.option(
    "--eval-every",
    type=int,
    default=0,
    show_default=True,
    help="Also evaluate every K updates, for time-to-accuracy (0: only at the end).",
)
@click.option("--target-accuracy", type=float, default=None, help="Time-to-accuracy target as a fraction, e.g. 0.85.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    required=True,
    help="Experiment directory (see bno-hvd report).",
)
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on rank 0.")
def experiment(
    models, strategies, updates, average_every, eval_on, eval_every, target_accuracy, out_dir, progress, **kw
):
    """Run every model x strategy for --updates weight updates in one horovodrun job; rank 0 writes
    averages.csv, summary.csv/json and the figures to --out."""
    model_names = parse_name_list(models, "--models", MODEL_NAMES)
    strategy_names = parse_name_list(strategies, "--strategies", STRATEGY_NAMES)
    base = config_from_flags(
        model=model_names[0],
        strategy=strategy_names[0],
        updates=updates,
        eval=eval_on,
        eval_every=eval_every,
        progress=progress,
        **kw,
    )
    check_experiment(updates, average_every, eval_on, target_accuracy, out_dir)
    # torch, MPI and Horovod load only when a run starts
    from bno_hvd.lab.report import format_summary
    from bno_hvd.lab.suites import run_experiment
    from bno_hvd.processes.world import init_world

    rows = run_experiment(
        base,
        model_names,
        strategy_names,
        average_every,
        target_accuracy,
        out_dir,
        init_world(**base.world_options()),
        " ".join(sys.argv[1:]),
        echo=lambda m: click.echo(m, err=True),
    )
    if rows is not None:
        click.echo(format_summary(rows))
        click.echo(f"wrote {out_dir}/averages.csv, summary.csv, summary.json and figures")


@click.command()
@click.argument("logdir", type=click.Path())
@click.option("--average-every", type=int, default=None, help="Block size (default: the experiment's).")
@click.option(
    "--target-accuracy", type=float, default=None, help="Time-to-accuracy target (default: the experiment's)."
)
def report(logdir, average_every, target_accuracy):
    """Redraw averages.csv, summary.csv/json and the figures of an experiment from its logs (no MPI)."""
    from bno_hvd.lab.report import format_summary, write_experiment_report

    rows = write_experiment_report(logdir, average_every, target_accuracy, warn=lambda m: click.echo(m, err=True))
    click.echo(format_summary(rows))
    click.echo(f"wrote {logdir}/averages.csv, summary.csv, summary.json and figures")


COMMANDS = [experiment, report]
