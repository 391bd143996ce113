"""``bno-hvd check-hostfile``: validate a hostfile before horovodrun reads it."""

from __future__ import annotations

import click

from ..errors import UsageError
from ..hostfile import check_hosts_resolvable, parse_hostfile, total_slots, write_clean_hostfile


@click.command("check-hostfile")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--np", "np_", type=int, default=None, help="Fail unless the hostfile has at least this many slots.")
@click.option(
    "--write-clean",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a normalised copy (no comments or blank lines) for horovodrun.",
)
@click.option("--resolve/--no-resolve", default=True, show_default=True, help="Check that every host resolves.")
def check_hostfile(path, np_, write_clean, resolve):
    """Validate PATH (blank lines, comments, slots=N) and print the host list."""
    hosts = parse_hostfile(path)
    if resolve:
        check_hosts_resolvable(hosts)
    slots = total_slots(hosts)
    if np_ is not None and np_ > slots:
        raise UsageError(f"{path} has {slots} slots but -np {np_} was asked; add hosts or raise slots=")
    if write_clean:
        write_clean_hostfile(hosts, write_clean)
    click.echo(",".join(f"{h.hostname}:{h.slots}" for h in hosts))


COMMANDS = [check_hostfile]
