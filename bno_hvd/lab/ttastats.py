"""Time to a target test accuracy, reported the MLPerf way (``bno-hvd time-to-accuracy``). Pure:
the runs' numbers in, the summary and its Markdown table out.

Every strategy trains R whole runs from scratch, one per round, the strategies in a new random
order each round. A run's time to target is the training time (evaluations not counted) at its
first evaluation at or above the target. Per strategy the score is MLPerf's: the mean of the runs'
times without the fastest and the slowest run. A run that never reached the target within the
update budget counts as infinitely slow, as in MLPerf: one such run is the slowest and is left
out; two or more leave the strategy without a score ("not reached"), never silently dropped.

Usage::

    runs = {"equal": [{"time_to_target_s": 61.0, "final_accuracy": 0.853, ...}, ...], ...}
    table = summarize(runs, baseline="equal")          # per strategy: mean, x equal, reached
    print(markdown_table(table, runs, target=0.85))
"""

from __future__ import annotations

import math

from bno_hvd.allocation.rounding import round_to_total


def mlperf_mean(times: list[float | None]) -> float | None:
    """The mean of ``times`` without the fastest and the slowest (None = never reached = slowest).

    Fewer than 3 runs (a smoke test) are averaged whole. None when there is no run, or when a
    time left after trimming is None (of 3 or more runs, two or more never reached the target)."""
    ordered = sorted(math.inf if t is None else float(t) for t in times)
    if len(ordered) >= 3:
        ordered = ordered[1:-1]
    return None if not ordered or math.isinf(ordered[-1]) else sum(ordered) / len(ordered)


def trimmed_indices(times: list[float | None]) -> tuple[int, int] | None:
    """Which two runs :func:`mlperf_mean` leaves out: ``(fastest, slowest)`` (first of ties; None
    is the slowest); None for fewer than 3 runs (none left out)."""
    if len(times) < 3:
        return None
    keys = [math.inf if t is None else float(t) for t in times]
    fastest = min(range(len(keys)), key=lambda i: keys[i])
    slowest = max((i for i in range(len(keys)) if i != fastest), key=lambda i: keys[i])
    return fastest, slowest


def split_by_limits(limits: list[float], total: int) -> list[int]:
    """The split a user would write by hand for ``fixed``: ``total`` samples in proportion to the
    ranks' CPU limits (whole samples, at least 1 each, summing to ``total``)."""
    return round_to_total([total * q / sum(limits) for q in limits], total, 1)


def summarize(runs: dict[str, list[dict]], baseline: str = "equal") -> dict[str, dict]:
    """Per strategy (in the order of ``runs``): its MLPerf mean (s), how many runs reached the
    target, and ``x_baseline``: the baseline's mean over its own (a speed-up: > 1 is faster; None
    where either mean does not exist), and the median update at which its runs reached it (``bno``
    changes the global batch, so its runs need other numbers of updates). Each run is a dict with
    ``time_to_target_s`` (None: not reached) and ``update_at_target``."""
    means = {name: mlperf_mean([r["time_to_target_s"] for r in rs]) for name, rs in runs.items()}
    base = means.get(baseline)
    out = {}
    for name, rs in runs.items():
        times = [r["time_to_target_s"] for r in rs]
        mean = means[name]
        out[name] = {
            "runs": len(rs),
            "reached": sum(t is not None for t in times),
            "mlperf_mean_s": mean,
            "x_" + baseline: base / mean if base and mean else None,
            "median_updates_to_target": _median(
                [r["update_at_target"] for r in rs if r["time_to_target_s"] is not None]
            ),
            "left_out": list(trimmed_indices(times) or ()),  # indices into this strategy's runs
        }
    return out


def _median(values: list) -> float | None:
    ordered = sorted(values)
    n = len(ordered)
    return None if n == 0 else (ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2)


def _seconds(t: float | None) -> str:
    return "-" if t is None else f"{t:.1f}"


def run_cell(run: dict, dropped: bool) -> str:
    """One run: its time to target (s) and final accuracy; ``*`` when the MLPerf mean left it out."""
    acc = run.get("final_accuracy")
    acc_text = "-" if acc is None else f"{acc:.3f}"
    if run["time_to_target_s"] is None:
        text = f"not reached ({acc_text} after {run['updates']} updates)"
    else:
        text = f"{run['time_to_target_s']:.1f} ({acc_text})"
    return text + ("*" if dropped else "")


def markdown_table(
    summary: dict[str, dict], runs: dict[str, list[dict]], target: float, baseline: str = "equal"
) -> str:
    """The table the benchmark page shows: per strategy, the MLPerf mean, the speed-up over the
    baseline, how many runs reached the target, and every run in round order."""
    key = "x_" + baseline
    lines = [
        f"| strategy | time to {target:.0%} (s, mean without fastest and slowest) | x {baseline} | reached "
        f"| updates to target (median) | runs: time to target s (final accuracy), round order |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        ratio = "-" if row[key] is None else f"{row[key]:.2f}"
        mean = _seconds(row["mlperf_mean_s"]) if row["mlperf_mean_s"] is not None else "not reached"
        cells = ", ".join(run_cell(r, i in row["left_out"]) for i, r in enumerate(runs[name]))
        updates = "-" if row["median_updates_to_target"] is None else f"{row['median_updates_to_target']:g}"
        lines.append(f"| {name} | {mean} | {ratio} | {row['reached']}/{row['runs']} | {updates} | {cells} |")
    lines.append("")
    lines.append(
        "\\* left out of the mean (the fastest and the slowest run). Time: training seconds to the first "
        "evaluation at or above the target (evaluations not counted)."
    )
    return "\n".join(lines) + "\n"


def markdown_report(data: dict) -> str:
    """``time-to-accuracy.md``: what was measured, when, on which commit and with which command,
    then :func:`markdown_table` (``data``: the ``time-to-accuracy.json`` the command writes)."""
    meta = data["meta"]
    head = (
        f"Time to {meta['target_accuracy']:.0%} test accuracy: {meta['label']}; {meta['ranks']} ranks, "
        f"{meta['rounds']} rounds of one run per strategy in random order after a warm-up of "
        f"{meta['warmup']} updates each; update budget {meta['updates']}, evaluated every "
        f"{meta['eval_every']} updates.\n\nMeasured {meta['date']} on commit {meta['commit']}: `{meta['command']}`\n\n"
    )
    return head + markdown_table(data["summary"], data["runs"], meta["target_accuracy"], data["baseline"])
