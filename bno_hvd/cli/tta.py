"""``bno-hvd time-to-accuracy``: every strategy's whole runs to a target test accuracy, in
interleaved random rounds, reported the MLPerf way (:mod:`bno_hvd.lab.ttastats`)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import click

from bno_hvd.cli.bench import parse_strategies
from bno_hvd.cli.flags import config_from_flags, train_options
from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import show_path

DEFAULT_STRATEGIES = "equal,balanced,lbbsp,proportional,paramhub,bno,fixed"


def check_tta(names, target, eval_every, rounds, warmup, updates, kw) -> None:
    """The checks that need more than one flag (TrainConfig checks the rest)."""
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UsageError(f"--strategies names {','.join(repeated)} more than once; give each strategy once")
    if kw.get("dataset") == "text":
        raise UsageError("time-to-accuracy measures test accuracy: use an image dataset (text reports perplexity)")
    if not 0 < target <= 1:
        raise UsageError(f"--target-accuracy {target:g} must be a fraction in (0, 1], e.g. 0.85")
    if not 1 <= eval_every <= updates:
        raise UsageError(f"--eval-every {eval_every} must be between 1 and --updates ({updates})")
    if rounds < 1 or warmup < 0:
        raise UsageError(f"--rounds {rounds} must be >= 1 and --warmup {warmup} >= 0")
    if "fixed" in names and not kw.get("batch_sizes") and not kw.get("cpu_quota"):
        raise UsageError("'fixed' needs its split: give --batch-sizes, or --cpu-quota (split in proportion to it)")


def commit_of_checkout() -> str:
    """The short commit of the checkout bno-hvd runs from, ``+`` if it has changes ("unknown" outside git)."""
    where = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "-C", where, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


@click.command("time-to-accuracy")
@train_options(exclude=("strategy",))
@click.option("--strategies", default=DEFAULT_STRATEGIES, show_default=True, help="Comma-separated strategies.")
@click.option("--target-accuracy", type=float, default=0.85, show_default=True, help="Target test accuracy.")
@click.option(
    "--eval-every", type=int, default=50, show_default=True, help="Evaluate the whole test split every K updates."
)
@click.option("--rounds", type=int, default=5, show_default=True, help="Runs per strategy, one per round.")
@click.option("--warmup", type=int, default=20, show_default=True, help="Untimed updates of each strategy first.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    required=True,
    help="Writes time-to-accuracy.json, .md (the table) and .png, and each run's logs under runs/.",
)
@click.option("--redraw", is_flag=True, help="Only redraw .md and .png from --out's time-to-accuracy.json (no MPI).")
def time_to_accuracy(strategies, target_accuracy, eval_every, rounds, warmup, out_dir, redraw, **kw):
    """Whole runs of every strategy until the test accuracy reaches --target-accuracy (or --updates,
    the budget), one run per strategy per round in a new random order (from --seed), after an
    untimed warm-up. Rank 0 prints the Markdown table: per strategy the mean time to target
    without the fastest and the slowest run (MLPerf), its speed-up over equal, and every run.
    'fixed' without --batch-sizes splits in proportion to --cpu-quota."""
    from bno_hvd.lab.report import TTA_NAME, write_tta_report

    if redraw:
        click.echo(write_tta_report(out_dir), nl=False)
        return
    names = parse_strategies(strategies)
    check_tta(names, target_accuracy, eval_every, rounds, warmup, kw["updates"], kw)
    if "fixed" in names and not kw.get("batch_sizes"):
        from bno_hvd.lab.cpuquota import parse_quotas
        from bno_hvd.lab.ttastats import split_by_limits

        quotas = parse_quotas(kw["cpu_quota"])
        kw["batch_sizes"] = ",".join(map(str, split_by_limits(quotas, len(quotas) * kw["base_batch_size"])))
    # the first run's config checks every flag; --batch-sizes belongs to 'fixed' alone
    first = "fixed" if "fixed" in names else names[0]
    base = config_from_flags(strategy=first, eval=True, progress=False, **kw)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out {show_path(out_dir)}: cannot create it ({err.strerror})") from None
    # torch, MPI and Horovod load only when a run starts
    from bno_hvd.common.atomic import write_json_atomic
    from bno_hvd.lab.heterogeneity import from_config
    from bno_hvd.lab.suites import run_time_to_accuracy
    from bno_hvd.processes.world import init_world

    world = init_world(**base.world_options())
    echo = lambda m: click.echo(m, err=True)  # noqa: E731
    outcome = run_time_to_accuracy(base, names, target_accuracy, eval_every, rounds, warmup, out_dir, world, echo)
    if outcome is None:  # not rank 0
        return
    meta = {
        "target_accuracy": target_accuracy,
        "updates": base.updates,
        "eval_every": eval_every,
        "rounds": rounds,
        "warmup": warmup,
        "ranks": world.size,
        "label": from_config(base, world.size).label(),
        "strategies": names,
        "batch_sizes_fixed": list(base.batch_sizes) if base.batch_sizes else None,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit_of_checkout(),
        "command": "bno-hvd " + " ".join(sys.argv[1:]),
        "config": base.to_dict(),
    }
    write_json_atomic(os.path.join(out_dir, TTA_NAME + ".json"), dict(outcome, meta=meta))
    click.echo(write_tta_report(out_dir), nl=False)
    click.echo(f"wrote {out_dir}/{TTA_NAME}.json, {TTA_NAME}.md, {TTA_NAME}.png and runs/")


COMMANDS = [time_to_accuracy]
