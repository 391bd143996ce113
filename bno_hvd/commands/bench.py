"""``bno-hvd bench``: run strategies one after another under the same (emulated) profile and
compare them: samples/s, weight-update time, speedup over equal, fraction of ideal, control cost."""
from __future__ import annotations

import csv
import gc
import json
import os

import click

from ..allocation import STRATEGY_NAMES
from ..bench import TABLE_COLUMNS, format_table, recovery_intervals, rolling_efficiency, summarize, with_speedups
from ..errors import UsageError
from .train import config_from_flags, train_options

DEFAULT_STRATEGIES = "equal,balanced,bno,lbbsp,proportional,paramhub,random"


def parse_strategies(text: str) -> list[str]:
    from ..cli import parse_name_list
    return parse_name_list(text, "--strategies", STRATEGY_NAMES)


@click.command()
@train_options(exclude=("strategy",))
@click.option("--strategies", default=DEFAULT_STRATEGIES, show_default=True, help="Comma-separated strategies to compare.")
@click.option("--warmup", type=int, default=10, show_default=True, help="Updates left out of the averages.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write bench.json, bench.csv, bench.png and each strategy's logs here.")
@click.option("--progress/--no-progress", default=True, show_default=True)
def bench(strategies, warmup, out_dir, progress, **kw):
    """Compare allocation strategies in one horovodrun job (rank 0 prints the table)."""
    names = parse_strategies(strategies)
    base = config_from_flags(strategy=names[0], eval=False, progress=progress, **kw)
    if warmup < 0 or warmup + 2 > base.updates:
        raise UsageError(f"--warmup {warmup} must be >= 0 and leave at least 2 of the {base.updates} updates")
    from ..train import init_horovod, run_training
    hvd, control_comm, monitor_comm = init_horovod()
    master = hvd.rank() == 0
    runs, summaries = {}, []
    for name in names:
        log_dir = os.path.join(out_dir, "runs", name) if out_dir else None
        cfg = base.replace(strategy=name, log_dir=log_dir)
        if master:
            click.echo(f"== {name}", err=True)
        result = run_training(cfg, hvd, control_comm, monitor_comm)
        gc.collect()  # free the finished run's model and optimizer before the next one
        if master:
            runs[name] = result
            summaries.append(summarize(name, result["records"], result["rank_steps"], warmup))
    if not master:
        return
    with_speedups(summaries)
    label = emulation_label(base)
    click.echo(label)
    click.echo(format_table(summaries))
    for name, result in runs.items():
        worst = max(result.get("emulation_overruns") or [0])
        if worst > 0.05 * base.updates:
            click.echo(f"warning: {name}: a rank's real compute exceeded its emulated time in {worst} of "
                       f"{base.updates} updates; results are not a clean emulation, lower --emulate-rate", err=True)
    recovery = schedule_recovery(base, runs) if base.emulate_schedule else None
    if recovery:
        click.echo("recovery after each speed change (rebalance intervals to reach 90% of the new ideal; - = never):")
        for name, values in recovery.items():
            click.echo(f"  {name:<13}" + "  ".join("-" if v is None else f"{v:.1f}" for v in values))
    if out_dir:
        write_outputs(out_dir, base, summaries, runs, label, recovery)
        click.echo(f"wrote {out_dir}/bench.json, bench.csv, bench.png")


def emulation_label(cfg) -> str:
    if cfg.emulate_schedule:
        return f"EMULATED heterogeneity: schedule {cfg.emulate_schedule}, {cfg.emulate_rate:g} samples/s at speed 1"
    if cfg.emulate_speed:
        return (f"EMULATED heterogeneity: speeds {','.join(f'{s:g}' for s in cfg.emulate_speed)}, "
                f"{cfg.emulate_rate:g} samples/s at speed 1")
    return "no emulation: real ranks of this machine"


def schedule_changes(cfg) -> list[int]:
    with open(cfg.emulate_schedule) as fh:
        raw = json.load(fh)
    return sorted(int(e["update"]) for e in raw if int(e["update"]) > 0) if raw else []


def schedule_recovery(cfg, runs: dict) -> dict:
    changes = schedule_changes(cfg)
    out = {}
    for name, result in runs.items():
        eff = rolling_efficiency(result["records"], result["rank_steps"], cfg.rebalance_every)
        out[name] = recovery_intervals(eff, changes, cfg.rebalance_every)
    return out


def write_outputs(out_dir, cfg, summaries, runs, label, recovery) -> None:
    from ..runlog import write_json_atomic
    os.makedirs(out_dir, exist_ok=True)
    records = []
    for s in summaries:
        rec = s.to_dict()
        rec["emulation"] = label
        if recovery:
            rec["recovery_intervals"] = recovery[s.strategy]
        records.append(rec)
    write_json_atomic(os.path.join(out_dir, "bench.json"), records)
    tmp = os.path.join(out_dir, "bench.csv.tmp")
    with open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(TABLE_COLUMNS)
        for s in summaries:
            row = s.to_dict()
            writer.writerow([";".join(map(str, row[c])) if isinstance(row[c], list) else row[c] for c in TABLE_COLUMNS])
    os.replace(tmp, os.path.join(out_dir, "bench.csv"))
    from ..plots import plot_update_times
    changes = schedule_changes(cfg) if cfg.emulate_schedule else []
    plot_update_times({n: r["records"] for n, r in runs.items()}, os.path.join(out_dir, "bench.png"),
                      title=f"weight-update time per update ({cfg.model}, {len(runs[summaries[0].strategy]['rank_steps'])} ranks)\n{label}",
                      markers=changes)


COMMANDS = [bench]
