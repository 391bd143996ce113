"""Hostfile validation: parse ``hostname slots=N`` lines strictly, then hand horovodrun a clean copy.

horovodrun's own parser takes ``line.split()[0]`` and ``line.split('=')[1]`` of every line, so a
blank line (also a trailing one) or a comment crashes it with an IndexError, and anything after
``slots=N`` ends up in the slot count. We validate first, with line numbers and fix-it messages,
and pass horovodrun a normalised file via :func:`write_clean_hostfile`.

Accepted format, one host per line; blank lines and ``#`` comments (full-line or trailing) are skipped::

    # name-or-address  slots=<processes on that host>
    node1 slots=2
    10.0.0.2 slots=4   # the GPU box

Usage::

    hosts = parse_hostfile("hostfiles/localhost")
    check_hosts_resolvable(hosts)
    write_clean_hostfile(hosts, "runs/hostfile")
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import click

from bno_hvd.common.atomic import write_text_atomic
from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import SLOTS, show_path

_SLOTS = re.compile(r"slots=(\S*)")
# horovodrun joins hosts as "name:slots,name:slots", so these characters cannot be in a name.
_FORBIDDEN_IN_NAME = (":", ",", "=")
MAX_NAME = 253  # characters of a DNS name


@dataclass(frozen=True)
class HostSlots:
    """One hostfile entry: ``slots`` processes (ranks) are started on ``hostname``."""

    hostname: str
    slots: int


def parse_hostfile(path) -> list[HostSlots]:
    """Parse and validate a hostfile; returns its hosts in file order.

    Raises :class:`UsageError` (``"hostfile X line K: ..."``) for an unreadable file, a missing or
    bad ``slots=N`` (N must be a positive integer), extra tokens, a duplicate host, or no hosts.
    """
    path = os.fspath(path)
    try:  # utf-8-sig: a byte-order mark (Windows editors write one) is not part of the first hostname
        with open(path, encoding="utf-8-sig") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise UsageError(
            f"hostfile {show_path(path)}: cannot read it ({reason}); give a text file of 'hostname slots=N' lines"
        ) from None

    hosts: list[HostSlots] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        tokens = line.split("#", 1)[0].split()
        if not tokens:
            continue
        where = f"hostfile {show_path(path)} line {number}"
        host = _parse_line(tokens, where)
        if host.hostname in first_line:
            raise UsageError(
                f"{where}: duplicate host {host.hostname!r} (first on line {first_line[host.hostname]}); "
                f"merge them into one line with the total slots"
            )
        first_line[host.hostname] = number
        hosts.append(host)
    if not hosts:
        raise UsageError(f"hostfile {show_path(path)}: no hosts in it; add lines like 'localhost slots=4'")
    return hosts


def _parse_line(tokens: list[str], where: str) -> HostSlots:
    name = tokens[0]
    if not name.isprintable() or len(name) > MAX_NAME:
        raise UsageError(
            f"{where}: hostname {name[:40]!r}{'...' if len(name) > 40 else ''} is not a host name "
            f"(at most {MAX_NAME} printable characters); use a plain hostname or IPv4 address"
        )
    if name.startswith("slots="):
        raise UsageError(f"{where}: line starts with {name!r}; write the hostname first, as 'hostname {name}'")
    if ":" in name and len(tokens) == 1 and name.rsplit(":", 1)[1].isdigit():
        host, slots = name.rsplit(":", 1)
        raise UsageError(f"{where}: {name!r} is the -H format; in a hostfile write '{host} slots={slots}'")
    if any(c in name for c in _FORBIDDEN_IN_NAME):
        raise UsageError(f"{where}: hostname {name!r} contains ':', ',' or '='; use a plain hostname or IPv4 address")
    if len(tokens) == 1:
        raise UsageError(f"{where}: missing 'slots=N' after {name!r}; write '{name} slots=N'")
    match = _SLOTS.fullmatch(tokens[1])
    if match is None:
        raise UsageError(f"{where}: unexpected {tokens[1]!r} after {name!r}; write '{name} slots=N'")
    if len(tokens) > 2:
        raise UsageError(
            f"{where}: unexpected {' '.join(tokens[2:])!r} after 'slots=N'; remove it or make it a '#' comment"
        )
    value = match.group(1)
    if not re.fullmatch(r"[0-9]+", value) or int(value) <= 0:
        raise UsageError(
            f"{where}: bad slot count {value[:20]!r}; slots must be a positive integer, e.g. '{name} slots=2'"
        )
    if len(value) > 9 or int(value) > SLOTS.high:
        raise UsageError(f"{where}: slot count {value[:20]} is too large; slots must be {SLOTS.describe()}")
    return HostSlots(name, int(value))


def check_hosts_resolvable(hosts: Iterable[HostSlots | str]) -> None:
    """Raise :class:`UsageError` naming every host whose name does not resolve (``socket.getaddrinfo``)."""
    unknown = []
    for host in hosts:
        name = host.hostname if isinstance(host, HostSlots) else host
        try:
            socket.getaddrinfo(name, None)
        except (socket.gaierror, UnicodeError):
            unknown.append(name)
    if unknown:
        raise UsageError(
            f"unknown host(s) {', '.join(map(repr, unknown))}: the name does not resolve; "
            f"fix the hostfile or add the host to /etc/hosts"
        )


def write_clean_hostfile(hosts: Iterable[HostSlots], path) -> None:
    """Write ``hosts`` as ``hostname slots=N`` lines, no blanks or comments: what horovodrun can parse."""
    write_text_atomic(path, "".join(f"{h.hostname} slots={h.slots}\n" for h in hosts))


def total_slots(hosts: Iterable[HostSlots]) -> int:
    """Total number of processes the hosts can run: the sum of their slots."""
    return sum(h.slots for h in hosts)


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
