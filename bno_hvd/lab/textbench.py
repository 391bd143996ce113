"""``bno-hvd bench --dataset text``: ways of splitting variable-length text, side by side.

Each entry is ``strategy:unit`` (``unit``: ``samples``, ``tokens`` or ``cost``, as
``--allocate-by``): ``equal:samples`` is equal sequences per rank, ``equal:tokens`` equal tokens
per rank, ``balanced:samples`` today's ``balanced`` by sample count, ``balanced:cost`` the
cost-aware one; the baselines take any unit. Every entry trains the same global batches (the
next ``--global-batch`` sequences of the same stream), so with the same number of updates the
models are the same up to rounding: the perplexity column checks that.

Tokens/s is the figure of merit (sequences differ several-fold in tokens); samples/s beside it.
"Ideal" is the tokens/s if no rank ever waited: the sum over ranks of each rank's own tokens per
compute second, measured in the same run (a rank's rate depends on the lengths it got, so this
is an estimate). Ratios are from one job, the entries one after another.
"""

from __future__ import annotations

import gc
import math
from dataclasses import asdict, dataclass

from bno_hvd.common.errors import UsageError
from bno_hvd.lab.plugin import lab_plugin
from bno_hvd.training.loop import run_training

UNITS = ("samples", "tokens", "cost")
DEFAULT_ENTRIES = "equal:samples,equal:tokens,balanced:samples,lbbsp:cost,proportional:cost,balanced:cost"
NAMES = {
    "equal:samples": "equal sequences per rank",
    "equal:tokens": "equal tokens per rank",
    "balanced:samples": "balanced by sample count",
    "balanced:cost": "balanced by cost (cost-aware)",
}


def parse_entries(text: str, strategies) -> list[tuple[str, str]]:
    """``"equal:samples,balanced:cost"`` -> ``[("equal", "samples"), ("balanced", "cost")]`` (unit default: cost)."""
    out = []
    for item in [t.strip() for t in text.split(",") if t.strip()]:
        name, _, unit = item.partition(":")
        unit = unit or "cost"
        if name not in strategies or unit not in UNITS or name in ("fixed", "bno"):
            raise UsageError(
                f"--strategies entry {item!r}: write strategy:unit with a strategy of "
                f"{', '.join(s for s in strategies if s not in ('fixed', 'bno'))} and a unit of {', '.join(UNITS)}"
            )
        if (name, unit) in out:
            raise UsageError(f"--strategies names {item} more than once; give each entry once")
        out.append((name, unit))
    if not out:
        raise UsageError("--strategies is empty; e.g. " + DEFAULT_ENTRIES)
    return out


@dataclass
class TextBenchRow:
    entry: str
    name: str
    updates: int
    tokens_per_s: float
    samples_per_s: float
    ideal_tokens_per_s: float
    fraction_of_ideal: float
    perplexity: float | None
    final_sequences: list[int]
    vs_sample_count_balanced: float | None = None
    vs_equal_sequences: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def summarize_text(entry: str, result, warmup: int) -> TextBenchRow:
    """Rates over updates ``warmup..end`` of one run (rank 0's ``RunResult``)."""
    records = result.records
    if len(records) <= warmup + 1:
        raise ValueError(f"need more than {warmup + 1} updates to summarise, got {len(records)}")
    recs = records[warmup:]
    begin = records[warmup - 1].time if warmup > 0 else recs[0].time - recs[0].weight_update_time
    wall = recs[-1].time - begin
    ideal = 0.0
    for steps in result.rank_steps:
        mine = steps[warmup:]
        seconds = sum(s.compute + s.gap for s in mine)
        ideal += sum(s.tokens for s in mine) / seconds if seconds > 0 else 0.0
    tokens = sum(r.global_tokens or 0 for r in recs)
    return TextBenchRow(
        entry=entry,
        name=NAMES.get(entry, entry.replace(":", " by ")),
        updates=len(recs),
        tokens_per_s=tokens / wall,
        samples_per_s=sum(r.global_batch for r in recs) / wall,
        ideal_tokens_per_s=ideal,
        fraction_of_ideal=tokens / wall / ideal if ideal > 0 else math.nan,
        perplexity=result.test_perplexity,
        final_sequences=list(records[-1].batch_sizes),
    )


def with_ratios(rows: list[TextBenchRow]) -> list[TextBenchRow]:
    by = {r.entry: r.tokens_per_s for r in rows}
    for r in rows:
        if "balanced:samples" in by:
            r.vs_sample_count_balanced = r.tokens_per_s / by["balanced:samples"]
        if "equal:samples" in by:
            r.vs_equal_sequences = r.tokens_per_s / by["equal:samples"]
    return rows


def run_text_bench(base, entries, warmup: int, world, echo) -> list[TextBenchRow] | None:
    """Train ``base`` once per ``(strategy, unit)``; rank 0 returns the rows (others None)."""
    results = {}
    for name, unit in entries:
        entry = f"{name}:{unit}"
        if world.master:
            echo(f"== {entry} ({NAMES.get(entry, '')})".replace(" ()", ""))
        cfg = base.replace(strategy=name, allocate_by=unit, eval=True)
        results[entry] = run_training(cfg, world, plugin=lab_plugin)
        gc.collect()
    if not world.master:
        return None
    return with_ratios([summarize_text(e, r, warmup) for e, r in results.items()])


def format_text_table(rows: list[TextBenchRow]) -> str:
    head = (
        f"{'entry':<19}{'what':<31}{'tokens/s':>10}{'samples/s':>11}{'% ideal':>9}{'vs bal.samples':>16}"
        f"{'vs equal seq':>14}{'perplexity':>12}  final sequences"
    )
    lines = [head]
    for r in rows:

        def ratio(x):
            return "-" if x is None else f"{x:.2f}x"

        ppl = "-" if r.perplexity is None else f"{r.perplexity:.3f}"
        lines.append(
            f"{r.entry:<19}{r.name[:30]:<31}{r.tokens_per_s:>10.0f}{r.samples_per_s:>11.1f}"
            f"{100 * r.fraction_of_ideal:>8.0f}%{ratio(r.vs_sample_count_balanced):>16}"
            f"{ratio(r.vs_equal_sequences):>14}{ppl:>12}  {','.join(map(str, r.final_sequences))}"
        )
    return "\n".join(lines)
