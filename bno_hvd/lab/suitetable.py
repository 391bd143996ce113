"""The profile suite's tables (``suite.md``): every strategy against ``equal`` and ``balanced``
against the best other strategy, per profile; and, when the suite ran variants of ``balanced``
(``balanced:sit_out=0``, ...), the ablation table: each variant over ``balanced`` in the same
round. Pure: the rows of :func:`bno_hvd.lab.profiles.profile_row` in, Markdown out.
"""

from __future__ import annotations

import math

from bno_hvd.lab.pairing import median_interval

STRATEGIES = ("equal", "balanced", "lbbsp", "proportional", "paramhub", "bno", "fixed")
LABELS = "Labels: REAL = CPU quotas or competing processes on this machine; EMULATED = ranks wait as if slower."


def geometric_mean(values) -> float:
    good = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in good) / len(good)) if good else math.nan


def suite_markdown(rows: list[dict], strategy: str = "balanced") -> str:
    """The suite's table: per profile, every strategy's median paired ratio to equal [95% interval]
    and of ideal; and ``strategy`` over the best other strategy of each round and over the peer
    with the best median (its own variants are not its peers). Variants (names with options) go
    to the ablation table below it."""
    names = sorted(
        {n for r in rows for n in r.get("strategies", {}) if ":" not in n},
        key=lambda n: STRATEGIES.index(n) if n in STRATEGIES else 99,
    )
    head = ["profile"] + [f"{n} x equal" for n in names if n != "equal"]
    head += [f"{strategy} / best other", f"{strategy} / top peer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['profile']} | " + r["error"] + " |")
            continue
        cells = [f"{r['profile']} ({r['label'].split(':')[0]})"]
        for n in names:
            if n == "equal":
                continue
            s = r["strategies"].get(n)
            cells.append("-" if s is None else f"{_interval(s['vs_equal'])}, {_pct(s['of_ideal'])} of ideal")
        own = r["strategies"].get(strategy)
        cells.append("-" if own is None else _interval(own["vs_best_other"]))
        top = (own or {}).get("top_peer")
        cells.append(f"{_interval(own['vs_top_peer'])} ({top})" if top else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for key, what in (("vs_best_other", "best other"), ("vs_top_peer", "top peer")):
        known = [r["strategies"][strategy].get(key) for r in rows if strategy in r.get("strategies", {})]
        known = [v for v in known if v and v[0] is not None]
        ratios, lows = [v[0] for v in known], [v[1] for v in known if v[1] is not None]
        lines.append(
            f"{strategy} / {what}: geometric mean of the medians {geometric_mean(ratios):.3f} over {len(ratios)} "
            f"profiles; lowest interval end {min(lows, default=math.nan):.3f}; interval's low end >= 0.97 on "
            f"{sum(1 for v in lows if v >= 0.97)}"
        )
    lines += [
        "",
        f"Best other: the fastest other strategy of each round (strict: a maximum of noisy rates). Top peer: "
        f"the other strategy with the best median x equal, paired with {strategy} per round.",
        "",
    ]
    ablation = ablation_markdown(rows, strategy)
    return "\n".join(lines + ([ablation, ""] if ablation else []) + [LABELS]) + "\n"


def ablation_markdown(rows: list[dict], strategy: str = "balanced") -> str:
    """Per profile, each variant ``strategy:...`` over ``strategy`` itself, paired per round
    (median [95% interval]); below 1 the variant is slower: the mechanism it turns off pays there.
    Empty when the suite ran no variant."""
    variants = sorted({n for r in rows for n in r.get("strategies", {}) if n.startswith(strategy + ":")})
    if not variants:
        return ""
    head = ["profile"] + [f"{v} / {strategy}" for v in variants]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    medians = {v: [] for v in variants}
    for r in rows:
        if "error" in r or strategy not in r.get("strategies", {}):
            continue
        base = r["strategies"][strategy].get("rates") or []
        cells = [f"{r['profile']} ({r['label'].split(':')[0]})"]
        for v in variants:
            rates = (r["strategies"].get(v) or {}).get("rates") or []
            paired = [x / b for x, b in zip(rates, base) if x is not None and b]
            interval = median_interval(paired) if paired else (math.nan,) * 3
            medians[v].append(interval[0])
            cells.append(_interval([None if not math.isfinite(x) else x for x in interval]))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("| geometric mean | " + " | ".join(f"{geometric_mean(medians[v]):.3f}" for v in variants) + " |")
    lowest = {v: min((x for x in medians[v] if math.isfinite(x)), default=math.nan) for v in variants}
    lines += ["", "Lowest median per variant: " + ", ".join(f"{v} {x:.2f}" for v, x in lowest.items())]
    return "\n".join(lines)


def _interval(v) -> str:
    median, low, high = (list(v) + [None, None, None])[:3]
    if median is None:
        return "-"
    if low is None:
        return f"{median:.2f}"
    return f"{median:.2f} [{low:.2f}, {high:.2f}]"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"
