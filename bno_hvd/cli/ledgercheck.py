"""``bno-hvd ledger check DIR``: every sample of every epoch used exactly once (:mod:`bno_hvd.training.ledger`)."""

from __future__ import annotations

import click

from bno_hvd.common.errors import UsageError


@click.group()
def ledger():
    """The sample ledger a bno-hvd train run writes to its --log-dir (ledger.jsonl)."""


@ledger.command()
@click.argument("directory", type=click.Path(file_okay=False))
def check(directory):
    """Prove each sample of each epoch was used exactly once across resumes and membership changes.

    Exit 0 with a summary line; exit 1 with one line naming the first sample lost or repeated."""
    from bno_hvd.training.ledger import check_entries, read_ledger

    header, entries = read_ledger(directory)
    try:
        click.echo(check_entries(header, entries))
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, UsageError):
            raise
        raise UsageError(f"{directory}/ledger.jsonl has an entry of another shape ({type(err).__name__})") from None


COMMANDS = [ledger]
