"""``bno-hvd bench --dataset text``: the entries of :mod:`bno_hvd.lab.textbench`, one table."""

from __future__ import annotations

import os

import click

from bno_hvd.allocation import STRATEGY_NAMES
from bno_hvd.cli.flags import config_from_flags
from bno_hvd.common.atomic import write_json_atomic
from bno_hvd.common.errors import UsageError
from bno_hvd.lab.textbench import DEFAULT_ENTRIES, format_text_table, parse_entries


def text_bench(strategies: str | None, warmup: int, out_dir: str | None, progress: bool, kw: dict) -> None:
    """Run the text entries (``strategy:unit``; None: the default list) and print the table on rank 0."""
    entries = parse_entries(strategies or DEFAULT_ENTRIES, STRATEGY_NAMES)
    if kw.get("global_tokens") is not None:
        raise UsageError(
            "bench --dataset text keeps the global batch in sequences (--global-batch), so that every entry, "
            "also those by samples, trains the same batches; drop --global-tokens"
        )
    kw = {k: v for k, v in kw.items() if k not in ("allocate_by", "batch_sizes")}
    base = config_from_flags(strategy=entries[0][0], allocate_by=entries[0][1], eval=True, progress=progress, **kw)
    if warmup < 0 or warmup + 2 > base.updates:
        raise UsageError(f"--warmup {warmup} must be >= 0 and leave at least 2 of the {base.updates} updates")
    from bno_hvd.lab.heterogeneity import from_config
    from bno_hvd.lab.textbench import run_text_bench
    from bno_hvd.processes.world import init_world

    world = init_world(base.collectives, engine=base.engine)
    rows = run_text_bench(base, entries, warmup, world, echo=lambda m: click.echo(m, err=True))
    if rows is None:
        return
    label = from_config(base, world.size).label()
    click.echo(label)
    click.echo(format_text_table(rows))
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "bench-text.json")
        write_json_atomic(path, {"label": label, "config": base.to_dict(), "rows": [r.to_dict() for r in rows]})
        click.echo(f"wrote {path}")
