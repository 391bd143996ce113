"""Paired comparisons of strategies run in interleaved rounds (``bno-hvd bench --rounds R``).

Every round runs one block of updates of each strategy, in a new random order. A strategy's
throughput in a round is divided by the baseline's (``equal``) in the *same* round, so whatever
slowed the machine during that round (a neighbour, a cron job) slows both and cancels out
(randomised multiple interleaved trials, Abedi & Brecht). Per strategy we report the median of
those paired ratios and a bootstrap 95% interval of the median (rounds resampled with
replacement, seeded). Pure: numbers in, numbers out.

Usage::

    rates = {"equal": [410.0, 395.2, ...], "balanced": [880.1, 901.7, ...]}    # samples/s per round
    paired_ratios(rates, "equal")["balanced"]        # [2.15, 2.28, ...]
    median_interval([2.15, 2.28, 2.2], seed=0)       # (2.2, 2.15, 2.28)
"""

from __future__ import annotations

import math

import numpy as np

BOOTSTRAP_SAMPLES = 4000  # resamples of the rounds; the interval's ends move < 1% beyond this


def block_rate(records) -> float:
    """Samples per second over one block of update records (its samples over its update times)."""
    seconds = sum(r.weight_update_time for r in records)
    return sum(r.global_batch for r in records) / seconds if seconds > 0 else math.nan


def round_orders(names: list[str], rounds: int, seed: int) -> list[list[str]]:
    """Each round's order of ``names``: a new random permutation per round, from ``seed``."""
    rng = np.random.default_rng(seed)
    return [[names[i] for i in rng.permutation(len(names))] for _ in range(rounds)]


def paired_ratios(rates: dict[str, list[float]], baseline: str) -> dict[str, list[float]]:
    """Per strategy, its rate over the baseline's in the same round (rounds where either is unknown dropped)."""
    base = rates[baseline]
    out = {}
    for name, values in rates.items():
        out[name] = [v / b for v, b in zip(values, base) if b > 0 and math.isfinite(v) and math.isfinite(b)]
    return out


def median_interval(values: list[float], seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """``(median, low, high)``: the median and a percentile-bootstrap ``level`` interval of it."""
    x = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    if x.size == 1:
        return float(x[0]), math.nan, math.nan
    rng = np.random.default_rng(seed)
    medians = np.median(x[rng.integers(0, x.size, size=(BOOTSTRAP_SAMPLES, x.size))], axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(medians, [tail, 1.0 - tail])
    return float(np.median(x)), float(low), float(high)


def comparison(rates: dict[str, list[float]], baseline: str, seed: int = 0) -> dict[str, dict]:
    """Per strategy: its per-round rates, paired ratios to ``baseline``, their median and interval,
    and two comparisons with the other strategies (a strategy's own variants, ``balanced`` and
    ``balanced:deadband=0`` in an ablation, are not each other's peers), ``[median, low, high]``:

    - ``vs_best_peer``: its ratio to the best *other* strategy of each round. Strict: the maximum
      of several noisy rates is above what any one of them sustains, so where every strategy runs
      the same split this is below 1 (seen: 0.93 at equal limits on REAL CPU limits);
    - ``vs_top_peer``: its ratio, paired per round, to the one peer with the highest median ratio
      to ``baseline`` (``top_peer`` names it): what a user who picked the best other strategy gets.

    Unknown values are None."""
    ratios = paired_ratios(rates, baseline)
    intervals = {name: median_interval(ratios[name], seed) for name in rates}
    out = {}
    for name, values in rates.items():
        median, low, high = intervals[name]
        peers = [p for p in rates if p.split(":")[0] != name.split(":")[0]]
        best = [max(rates[p][r] for p in peers) for r in range(len(values))] if peers else []
        vs_best = [v / b for v, b in zip(values, best) if b > 0 and math.isfinite(v)]
        known = [p for p in peers if math.isfinite(intervals[p][0])]
        top = max(known, key=lambda p: intervals[p][0]) if known else None
        vs_top = [v / b for v, b in zip(values, rates[top]) if b > 0 and math.isfinite(v)] if top else []
        out[name] = {
            "rates": [_num(v) for v in values],
            "ratios": [_num(v) for v in ratios[name]],
            "median": _num(median),
            "low": _num(low),
            "high": _num(high),
            "vs_best_peer": _interval(vs_best, seed),
            "top_peer": top,
            "vs_top_peer": _interval(vs_top, seed),
        }
    return out


def _interval(values: list[float], seed: int) -> list[float | None]:
    return [_num(v) for v in (median_interval(values, seed) if values else (math.nan,) * 3)]


def _num(x: float) -> float | None:
    """JSON has no NaN: an unknown value is None."""
    return float(x) if x is not None and math.isfinite(x) else None


def format_comparison(table: dict[str, dict], baseline: str) -> str:
    """The paired table: per strategy, median ratio to the baseline [95% interval], to the best
    other strategy of each round, and to the peer with the best median (named)."""
    head = (
        f"{'strategy':<13} {'x ' + baseline + ' (median [95% CI])':>32} {'x best other (median [95% CI])':>34}"
        f"  x top peer (median [95% CI])"
    )
    lines = [head]
    for name, row in table.items():
        m, lo, hi = (_nan(row[k]) for k in ("median", "low", "high"))
        bm, blo, bhi = (_nan(v) for v in row["vs_best_peer"])
        tm, tlo, thi = (_nan(v) for v in row["vs_top_peer"])
        top = f"{_ci(tm, tlo, thi)} ({row['top_peer']})" if row["top_peer"] else "-"
        lines.append(f"{name:<13} {_ci(m, lo, hi):>32} {_ci(bm, blo, bhi):>34}  {top}")
    return "\n".join(lines)


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _ci(median: float, low: float, high: float) -> str:
    if not math.isfinite(median):
        return "-"
    if not math.isfinite(low):
        return f"{median:.2f}"
    return f"{median:.2f} [{low:.2f}, {high:.2f}]"
