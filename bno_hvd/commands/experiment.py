"""``bno-hvd experiment``: the paper's evaluation in one horovodrun job (every model x strategy,
N weight updates each); ``bno-hvd report LOGDIR``: the CSVs and figures, redrawn from the logs.

Layout of an experiment directory (``--out``)::

    experiment.json                      what was run (models, strategies, flags, emulation); a later
                                         job with the same flags adds its models/strategies to it
    runs/<model>/<strategy>/             each run's logs (run.json, updates.jsonl, result.json, ranks.json)
    averages.csv                         mean weight-update time etc. per block of --average-every updates
    summary.csv, summary.json            per run: mean update time, samples/s, accuracy, time-to-accuracy
    fig_<model>.png                      paper Figures 3-6; summary.png: Figure 7
    accuracy_<model>.png                 test accuracy over training time (with --eval-every)
"""
from __future__ import annotations

import csv
import gc
import json
import math
import os
import sys

import click

from ..errors import UsageError
from ..experiment import (AVERAGE_COLUMNS, SUMMARY_COLUMNS, average_rows, block_averages, csv_cell,
                          emulation_label, merge_experiment, summary_row, with_final_eval)
from ..catalog import MODEL_NAMES
from .bench import emulation_label as config_emulation_label
from .bench import parse_strategies
from .train import config_from_flags, train_options

DEFAULT_MODELS = ",".join(MODEL_NAMES)
DEFAULT_STRATEGIES = "bno,equal,random,balanced"   # the paper's three, then ours


def parse_models(text: str) -> list[str]:
    from ..cli import parse_name_list
    return parse_name_list(text, "--models", MODEL_NAMES)


def check_experiment(updates: int, average_every: int, eval_on: bool, target: float | None, out_dir: str) -> None:
    """Flag checks that need more than one flag (TrainConfig checks the rest)."""
    if average_every < 1 or average_every > updates:
        raise UsageError(f"--average-every {average_every} must be between 1 and --updates ({updates})")
    if target is not None and not 0 < target <= 1:
        raise UsageError(f"--target-accuracy {target} must be a fraction in (0, 1], e.g. 0.85")
    if target is not None and not eval_on:
        raise UsageError("--target-accuracy needs the test split; drop --no-eval (and set --eval-every K)")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out {out_dir}: cannot create it ({err.strerror})") from None


def run_dir(out_dir: str, model: str, strategy: str) -> str:
    return os.path.join(out_dir, "runs", model, strategy)


@click.command()
@train_options(exclude=("strategy", "model", "updates"))
@click.option("--models", default=DEFAULT_MODELS, show_default=True, help="Comma-separated models, run in this order.")
@click.option("--strategies", default=DEFAULT_STRATEGIES, show_default=True, help="Comma-separated strategies (paper: bno,equal,random; ours: balanced).")
@click.option("--updates", type=int, default=2400, show_default=True, help="Weight updates per run (the paper: 2400).")
@click.option("--average-every", type=int, default=100, show_default=True, help="Average the weight-update time over blocks of this many updates.")
@click.option("--eval/--no-eval", "eval_on", default=True, show_default=True, help="Test accuracy at the end of each run.")
@click.option("--eval-every", type=int, default=0, show_default=True, help="Also evaluate every K updates, for time-to-accuracy (0: only at the end).")
@click.option("--target-accuracy", type=float, default=None, help="Time-to-accuracy target as a fraction, e.g. 0.85.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Experiment directory (see bno-hvd report).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on rank 0.")
def experiment(models, strategies, updates, average_every, eval_on, eval_every, target_accuracy, out_dir, progress, **kw):
    """Run every model x strategy for --updates weight updates in one horovodrun job; rank 0
    writes averages.csv, summary.csv/json and the figures to --out."""
    model_names, strategy_names = parse_models(models), parse_strategies(strategies)
    base = config_from_flags(model=model_names[0], strategy=strategy_names[0], updates=updates, eval=eval_on,
                             eval_every=eval_every, progress=progress, **kw)
    check_experiment(updates, average_every, eval_on, target_accuracy, out_dir)
    from ..train import TrainingError, init_horovod, run_training
    hvd, control_comm, monitor_comm = init_horovod()
    master = hvd.rank() == 0
    if master:
        from ..runlog import write_json_atomic
        path = os.path.join(out_dir, "experiment.json")
        try:
            old = _read_json(path) if os.path.exists(path) else None
        except UsageError:  # an unreadable earlier file starts a new experiment
            old = None
        write_json_atomic(path, merge_experiment(old, {
            "models": model_names, "strategies": strategy_names, "updates": updates,
            "average_every": average_every, "eval_every": eval_every, "target_accuracy": target_accuracy,
            "ranks": hvd.size(), "emulation": config_emulation_label(base), "config": base.to_dict(),
            "command": " ".join(sys.argv[1:])}))
    for model in model_names:
        for strategy in strategy_names:
            log_dir = run_dir(out_dir, model, strategy)
            if master:  # a failed run must not leave an older run's result behind
                for stale in ("result.json", "ranks.json"):
                    if os.path.exists(os.path.join(log_dir, stale)):
                        os.remove(os.path.join(log_dir, stale))
                click.echo(f"== {model} / {strategy}", err=True)
            try:
                run_training(base.replace(model=model, strategy=strategy, log_dir=log_dir),
                             hvd, control_comm, monitor_comm)
            except TrainingError as err:  # every rank sees the same global loss: all end here
                if master:
                    click.echo(f"bno-hvd: warning: {model}/{strategy} stopped: {err}", err=True)
            # Horovod's optimizer hooks keep each finished model in reference cycles; without a
            # full collection every run adds its model, gradients and momentum to the rank's RSS
            gc.collect()
    if master:
        rows = write_report(out_dir)
        click.echo(format_summary(rows))
        click.echo(f"wrote {out_dir}/averages.csv, summary.csv, summary.json and figures")


@click.command()
@click.argument("logdir", type=click.Path())
@click.option("--average-every", type=int, default=None, help="Block size (default: the experiment's).")
@click.option("--target-accuracy", type=float, default=None, help="Time-to-accuracy target (default: the experiment's).")
def report(logdir, average_every, target_accuracy):
    """Redraw averages.csv, summary.csv/json and the figures of an experiment from its logs (no MPI)."""
    rows = write_report(logdir, average_every, target_accuracy)
    click.echo(format_summary(rows))
    click.echo(f"wrote {logdir}/averages.csv, summary.csv, summary.json and figures")


def load_experiment(logdir: str) -> tuple[dict, list[tuple[str, str]]]:
    """The experiment's metadata (or {}) and its (model, strategy) runs, in run order."""
    if not os.path.isdir(logdir):
        raise UsageError(f"{logdir}: no such directory; give the --out directory of a bno-hvd experiment")
    meta = _read_json(os.path.join(logdir, "experiment.json")) if os.path.exists(os.path.join(logdir, "experiment.json")) else {}
    if meta.get("models") and meta.get("strategies"):
        pairs = [(m, s) for m in meta["models"] for s in meta["strategies"]]
    else:  # logs without experiment.json: whatever runs/<model>/<strategy>/ holds
        root = os.path.join(logdir, "runs")
        models = sorted(os.listdir(root), key=lambda m: (MODEL_NAMES.index(m) if m in MODEL_NAMES else 99, m)) \
            if os.path.isdir(root) else []
        pairs = [(m, s) for m in models for s in sorted(os.listdir(os.path.join(root, m)))]
    pairs = [(m, s) for m, s in pairs if os.path.exists(os.path.join(run_dir(logdir, m, s), "updates.jsonl"))]
    if not pairs:
        raise UsageError(f"{logdir}: no runs found (expected runs/<model>/<strategy>/updates.jsonl, "
                         "as written by bno-hvd experiment --out DIR)")
    return meta, pairs


def write_report(logdir: str, average_every: int | None = None, target: float | None = None) -> list[dict]:
    """Read every run's logs, write the CSVs, summary.json and PNGs; return the summary rows."""
    from ..runlog import read_updates, write_json_atomic
    meta, pairs = load_experiment(logdir)
    every = average_every or meta.get("average_every") or 100
    if every < 1:
        raise UsageError(f"--average-every {every} must be >= 1")
    target = target if target is not None else meta.get("target_accuracy")
    averages, summaries, blocks, evals_by = [], [], {}, {}
    for model, strategy in pairs:
        path = run_dir(logdir, model, strategy)
        records = read_updates(path)
        if not records:  # the run failed before its first update: a row says so, no figure line
            click.echo(f"bno-hvd: warning: {path} has no updates (the run failed; see the job's output)", err=True)
        run_meta = _read_json(os.path.join(path, "run.json"))
        result = _read_json(os.path.join(path, "result.json")) if os.path.exists(os.path.join(path, "result.json")) else None
        evals = with_final_eval(result.get("evals", []), result) if result else []
        label = emulation_label(run_meta)
        run_blocks = block_averages(records, every)
        if records:
            blocks.setdefault(model, {})[strategy] = run_blocks
        evals_by.setdefault(model, {})[strategy] = evals
        averages += average_rows(model, strategy, run_blocks, label)
        row = summary_row(model, strategy, records, result, evals, target, run_meta["world_size"], label)
        summaries.append(dict(row, evals=evals))
    if not blocks:
        raise UsageError(f"{logdir}: every run is empty; nothing to report")
    _write_csv(os.path.join(logdir, "averages.csv"), AVERAGE_COLUMNS, averages)
    _write_csv(os.path.join(logdir, "summary.csv"), SUMMARY_COLUMNS,
               [[row[c] for c in SUMMARY_COLUMNS] for row in summaries])
    write_json_atomic(os.path.join(logdir, "summary.json"),
                      {"experiment": {k: v for k, v in meta.items() if k not in ("config", "command")}, "average_every": every,
                       "target_accuracy": target, "runs": summaries})
    _draw(logdir, blocks, evals_by, summaries, every, target)
    return summaries


def _draw(logdir, blocks, evals_by, summaries, every, target) -> None:
    from ..plots import plot_accuracy, plot_block_averages, plot_summary_bars
    by_model = {}
    for row in summaries:
        by_model.setdefault(row["model"], []).append(row)
    for model, series in blocks.items():
        rows = [r for r in by_model[model] if r["updates"]]
        head = f"{model}: average weight-update time per {every} updates, {rows[0]['ranks']} ranks"
        plot_block_averages(series, os.path.join(logdir, f"fig_{model}.png"), every=every,
                            title=f"{head}\n{_labels(rows)}")
        curves = {s: e for s, e in evals_by[model].items() if len(e) >= 2}
        if curves:
            plot_accuracy(curves, os.path.join(logdir, f"accuracy_{model}.png"), target=target,
                          title=f"{model}: test accuracy over training time, {rows[0]['ranks']} ranks\n{_labels(rows)}")
    means = {m: {r["strategy"]: r["mean_weight_update_time_s"] for r in rows if r["updates"]} for m, rows in by_model.items()}
    plot_summary_bars(means, os.path.join(logdir, "summary.png"),
                      title=f"average weight-update time over all updates\n{_labels(summaries)}")


def _labels(rows) -> str:
    return "; ".join(dict.fromkeys(r["emulation"] for r in rows))


def format_summary(rows: list[dict]) -> str:
    head = (f"{'model':<10}{'strategy':<10}{'updates':>8}{'update (s)':>12}{'samples/s':>11}"
            f"{'accuracy':>10}{'to target (s)':>15}")
    lines = [head, "-" * len(head)]
    for r in rows:
        acc = "-" if r["final_accuracy"] is None else f"{100 * r['final_accuracy']:.2f}%"
        tta = "-" if r["time_to_accuracy_s"] is None else f"{r['time_to_accuracy_s']:.1f}"
        sps = r["samples_per_s"] if r["samples_per_s"] is not None else math.nan
        mean = r["mean_weight_update_time_s"] if r["mean_weight_update_time_s"] is not None else math.nan
        note = "" if r["status"] == "ok" else f"  {r['status']}"
        lines.append(f"{r['model']:<10}{r['strategy']:<10}{r['updates']:>8}{mean:>12.4f}"
                     f"{sps:>11.1f}{acc:>10}{tta:>15}{note}")
    lines.append(_labels(rows))
    return "\n".join(lines)


def _read_json(path: str):
    try:
        with open(path) as fh:
            return json.load(fh)
    except OSError as err:
        raise UsageError(f"{path}: cannot read ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise UsageError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None


def _write_csv(path: str, columns, rows) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([csv_cell(v) for v in row])
    os.replace(tmp, path)


COMMANDS = [experiment, report]
