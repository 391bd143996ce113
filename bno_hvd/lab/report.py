"""Result files from logged runs: an experiment's CSVs, summary and figures, and a bench's table
files. Reads only logs (no MPI), so ``bno-hvd report`` redraws everything after the fact.

Layout of an experiment directory (``bno-hvd experiment --out``)::

    experiment.json                      what was run (models, strategies, flags, heterogeneity); a later
                                         job with the same flags adds its models/strategies to it
    runs/<model>/<strategy>/             each run's logs (run.json, updates.jsonl, result.json, ranks.json)
    averages.csv                         mean weight-update time etc. per block of --average-every updates
    summary.csv, summary.json            per run: mean update time, samples/s, accuracy, time-to-accuracy
    fig_<model>.png                      paper Figures 3-6; summary.png: Figure 7
    accuracy_<model>.png                 test accuracy over training time (with --eval-every)
    stragglers_<model>_<strategy>.png    per rank and update: compute vs waiting for the others

A bench directory (``bno-hvd bench --out``) holds bench.json, bench.csv, bench.png,
stragglers_<strategy>.png and runs/<strategy>/.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os

from bno_hvd.common.atomic import atomic_write, write_json_atomic
from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import read_json
from bno_hvd.data.catalog import MODEL_NAMES
from bno_hvd.lab.averages import (
    AVERAGE_COLUMNS,
    SUMMARY_COLUMNS,
    average_rows,
    block_averages,
    csv_cell,
    summary_row,
    with_final_eval,
)
from bno_hvd.lab.benchstats import TABLE_COLUMNS, BenchSummary
from bno_hvd.lab.logread import read_experiment_file, read_result, read_run_meta, read_steps, read_updates


def run_dir(out_dir: str, model: str, strategy: str) -> str:
    return os.path.join(out_dir, "runs", model, strategy)


# -- experiments ---------------------------------------------------------------------------------


def load_experiment(logdir: str) -> tuple[dict, list[tuple[str, str]]]:
    """The experiment's metadata (or {}) and its (model, strategy) runs, in run order."""
    if not os.path.isdir(logdir):
        raise UsageError(f"{logdir}: no such directory; give the --out directory of a bno-hvd experiment")
    meta = read_experiment_file(os.path.join(logdir, "experiment.json"))
    if meta.get("models") and meta.get("strategies"):
        pairs = [(m, s) for m in meta["models"] for s in meta["strategies"]]
    else:  # logs without experiment.json: whatever runs/<model>/<strategy>/ holds
        root = os.path.join(logdir, "runs")
        models = (
            sorted(os.listdir(root), key=lambda m: (MODEL_NAMES.index(m) if m in MODEL_NAMES else 99, m))
            if os.path.isdir(root)
            else []
        )
        pairs = [
            (m, s)
            for m in models
            if os.path.isdir(os.path.join(root, m))
            for s in sorted(os.listdir(os.path.join(root, m)))
        ]
    pairs = [(m, s) for m, s in pairs if os.path.exists(os.path.join(run_dir(logdir, m, s), "updates.jsonl"))]
    if not pairs:
        raise UsageError(
            f"{logdir}: no runs found (expected runs/<model>/<strategy>/updates.jsonl, "
            "as written by bno-hvd experiment --out DIR)"
        )
    return meta, pairs


def write_experiment_report(
    logdir: str, average_every: int | None = None, target: float | None = None, warn=print
) -> list[dict]:
    """Read every run's logs, write the CSVs, summary.json and PNGs; return the summary rows."""
    meta, pairs = load_experiment(logdir)
    every = average_every or meta.get("average_every") or 100
    if every < 1:
        raise UsageError(f"--average-every {every} must be >= 1")
    target = target if target is not None else meta.get("target_accuracy")
    averages, summaries, blocks, evals_by = [], [], {}, {}
    runs = []  # everything is read and checked before anything is written
    for model, strategy in pairs:
        path = run_dir(logdir, model, strategy)
        world_size, label = read_run_meta(os.path.join(path, "run.json"))
        result = read_result(os.path.join(path, "result.json"))
        steps, why = read_steps(os.path.join(path, "ranks.json"))
        if steps is None and os.path.exists(os.path.join(path, "ranks.json")):
            warn(f"bno-hvd: warning: no straggler picture for {model}/{strategy}: {why}")
        runs.append((model, strategy, path, read_updates(path), world_size, label, result, steps))
    for model, strategy, path, records, world_size, label, result, steps in runs:
        if not records:  # the run failed before its first update: a row says so, no figure line
            warn(f"bno-hvd: warning: {path} has no updates (the run failed; see the job's output)")
        evals = with_final_eval(result.get("evals", []), result) if result else []
        run_blocks = block_averages(records, every)
        if records:
            blocks.setdefault(model, {})[strategy] = run_blocks
        evals_by.setdefault(model, {})[strategy] = evals
        averages += average_rows(model, strategy, run_blocks, label)
        row = summary_row(model, strategy, records, result, evals, target, world_size, label)
        summaries.append(dict(row, evals=evals))
        if steps is not None:
            plot_stragglers_png(
                steps,
                os.path.join(logdir, f"stragglers_{model}_{strategy}.png"),
                title=f"{model} / {strategy}: where each rank's update goes\n{label}",
            )
    if not blocks:
        raise UsageError(f"{logdir}: every run is empty; nothing to report")
    write_csv(os.path.join(logdir, "averages.csv"), AVERAGE_COLUMNS, averages)
    write_csv(
        os.path.join(logdir, "summary.csv"), SUMMARY_COLUMNS, [[row[c] for c in SUMMARY_COLUMNS] for row in summaries]
    )
    write_json_atomic(
        os.path.join(logdir, "summary.json"),
        {
            "experiment": {k: v for k, v in meta.items() if k not in ("config", "command")},
            "average_every": every,
            "target_accuracy": target,
            "runs": summaries,
        },
    )
    _draw_experiment(logdir, blocks, evals_by, summaries, every, target)
    return summaries


def _draw_experiment(logdir, blocks, evals_by, summaries, every, target) -> None:
    from bno_hvd.lab.plots import plot_accuracy, plot_block_averages, plot_summary_bars

    by_model = {}
    for row in summaries:
        by_model.setdefault(row["model"], []).append(row)
    for model, series in blocks.items():
        rows = [r for r in by_model[model] if r["updates"]]
        head = f"{model}: average weight-update time per {every} updates, {rows[0]['ranks']} ranks"
        plot_block_averages(
            series, os.path.join(logdir, f"fig_{model}.png"), every=every, title=f"{head}\n{_labels(rows)}"
        )
        curves = {s: e for s, e in evals_by[model].items() if len(e) >= 2}
        if curves:
            plot_accuracy(
                curves,
                os.path.join(logdir, f"accuracy_{model}.png"),
                target=target,
                title=f"{model}: test accuracy over training time, {rows[0]['ranks']} ranks\n{_labels(rows)}",
            )
    means = {
        m: {r["strategy"]: r["mean_weight_update_time_s"] for r in rows if r["updates"]} for m, rows in by_model.items()
    }
    plot_summary_bars(
        means,
        os.path.join(logdir, "summary.png"),
        title=f"average weight-update time over all updates\n{_labels(summaries)}",
    )


def _labels(rows) -> str:
    return "; ".join(dict.fromkeys(r["emulation"] for r in rows))


def format_summary(rows: list[dict]) -> str:
    head = (
        f"{'model':<10}{'strategy':<10}{'updates':>8}{'update (s)':>12}{'samples/s':>11}{'balance':>9}{'outside':>9}"
        f"{'accuracy':>10}{'to target (s)':>15}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        acc = "-" if r["final_accuracy"] is None else f"{100 * r['final_accuracy']:.2f}%"
        tta = "-" if r["time_to_accuracy_s"] is None else f"{r['time_to_accuracy_s']:.1f}"
        sps = r["samples_per_s"] if r["samples_per_s"] is not None else math.nan
        mean = r["mean_weight_update_time_s"] if r["mean_weight_update_time_s"] is not None else math.nan
        note = "" if r["status"] == "ok" else f"  {r['status']}"
        balance = "-" if r.get("compute_balance") is None else f"{r['compute_balance']:.2f}"
        outside = "-" if r.get("outside_compute_share") is None else f"{r['outside_compute_share']:.0%}"
        lines.append(
            f"{r['model']:<10}{r['strategy']:<10}{r['updates']:>8}{mean:>12.4f}{sps:>11.1f}{balance:>9}{outside:>9}"
            f"{acc:>10}{tta:>15}{note}"
        )
    lines.append(_labels(rows))
    return "\n".join(lines)


# -- benches -------------------------------------------------------------------------------------


def write_bench_outputs(
    out_dir: str,
    summaries: list[BenchSummary],
    records_by: dict,
    label: str,
    recovery: dict | None,
    changes: list[int],
    title: str,
    breakdown: dict | None = None,
    recovery_vs_best: dict | None = None,
    moves: dict | None = None,
    paired: dict | None = None,
    stalls: dict | None = None,
) -> None:
    """bench.json, bench.csv, bench.png and one straggler picture per strategy."""
    rows = []
    for s in summaries:
        row = dict(s.to_dict(), emulation=label)
        if recovery:
            row["recovery_intervals"] = recovery[s.strategy]
        if recovery_vs_best:
            row["recovery_vs_best_intervals"] = recovery_vs_best[s.strategy]
        if breakdown:
            row["rank_breakdown"] = [dataclasses.asdict(b) for b in breakdown[s.strategy]]
        if moves is not None:
            row["moves"] = [dataclasses.asdict(m) for m in moves[s.strategy]]
        if paired is not None:
            row["paired"] = paired[s.strategy]  # --rounds: per-round rates, paired ratios, median, interval
        if stalls is not None:
            row["stalls"] = [dataclasses.asdict(x) for x in stalls[s.strategy]]  # lab/stalls.py
        rows.append(row)
    write_json_atomic(os.path.join(out_dir, "bench.json"), rows)
    write_csv(
        os.path.join(out_dir, "bench.csv"), TABLE_COLUMNS, [[s.to_dict()[c] for c in TABLE_COLUMNS] for s in summaries]
    )
    from bno_hvd.lab.plots import plot_update_times

    plot_update_times(records_by, os.path.join(out_dir, "bench.png"), title=f"{title}\n{label}", markers=changes)
    for name in records_by:
        draw_stragglers(
            os.path.join(out_dir, "runs", name),
            os.path.join(out_dir, f"stragglers_{name}.png"),
            title=f"{name}: where each rank's update goes\n{label}",
        )


# -- shared --------------------------------------------------------------------------------------


def draw_stragglers(run_path: str, png: str, *, title: str) -> bool:
    """The per-rank timeline of a logged run (from its ranks.json); False when there is none."""
    steps, _ = read_steps(os.path.join(run_path, "ranks.json"))
    if steps is None:
        return False
    plot_stragglers_png(steps, png, title=title)
    return True


def plot_stragglers_png(steps, png: str, *, title: str) -> None:
    from bno_hvd.lab.plots import plot_stragglers

    plot_stragglers(steps, png, title=title)


def write_csv(path: str, columns, rows) -> None:
    def write(fh):
        writer = csv.writer(fh)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([csv_cell(v) for v in row])

    atomic_write(path, write)


def read_experiment_meta(path: str) -> dict | None:
    """An earlier experiment.json, or None when there is none or it cannot be read."""
    if not os.path.exists(path):
        return None
    try:
        meta = read_json(path, "experiment file")
    except UsageError:  # an unreadable earlier file starts a new experiment
        return None
    return meta if isinstance(meta, dict) else None


TTA_NAME = "time-to-accuracy"  # .json (written by the command), .md and .png (drawn from the .json)


def write_tta_report(out_dir: str) -> str:
    """``time-to-accuracy.md`` and ``.png`` in ``out_dir``, drawn from its ``time-to-accuracy.json``
    (``bno-hvd time-to-accuracy --redraw``); returns the Markdown."""
    from bno_hvd.lab.plots import plot_time_to_accuracy
    from bno_hvd.lab.ttastats import markdown_report

    base = os.path.join(out_dir, TTA_NAME)
    data = read_json(base + ".json", "time-to-accuracy results")
    text = markdown_report(data)
    atomic_write(base + ".md", lambda fh: fh.write(text))
    meta = data["meta"]
    title = f"time to {meta['target_accuracy']:.0%} test accuracy, {meta['rounds']} runs each ({meta['label']})"
    plot_time_to_accuracy(data["runs"], data["summary"], base + ".png", title=title)
    return text
