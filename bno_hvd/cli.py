"""The ``bno-hvd`` command (a click group). Config flows one way: flags -> TrainConfig.

User errors become one line on stderr and exit code 2; under MPI only rank 0 prints.
"""
from __future__ import annotations

import json
import os
import sys

import click

from .errors import UsageError


def launched_rank() -> int:
    """This process's rank from the launcher's environment (0 when not under MPI)."""
    for var in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def fail(message: str, code: int = 2):
    if launched_rank() == 0:
        click.echo(f"bno-hvd: error: {message}", err=True)
    sys.exit(code)


def parse_int_list(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected comma-separated integers like 5,11,3,13") from None
    if not values:
        raise UsageError(f"{flag} is empty; give one integer per rank, e.g. 5,11,3,13")
    if any(v < 1 for v in values):
        raise UsageError(f"{flag} {text!r}: every batch size must be >= 1")
    return values


def parse_name_list(text: str, flag: str, allowed) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``, every name one of ``allowed`` (else a one-line UsageError)."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in allowed]
    if not names or bad:
        raise UsageError(f"{flag} {text!r}: unknown {bad or 'empty list'}; choose from {','.join(allowed)}")
    return names


class Group(click.Group):
    """Turns UsageError (and click's own usage errors) into one line, exit 2."""

    def main(self, *args, **kwargs):
        kwargs.setdefault("standalone_mode", False)
        try:
            return super().main(*args, **kwargs)
        except UsageError as err:
            fail(str(err))
        except click.exceptions.Exit as err:
            sys.exit(err.exit_code)
        except click.Abort:
            fail("aborted", 130)
        except click.ClickException as err:
            fail(err.format_message().replace("\n", " "), err.exit_code)


@click.group(cls=Group)
@click.version_option(package_name="bno-hvd")
def main():
    """bno-hvd: heterogeneity-aware data-parallel training on Horovod (BalanceNet allocation)."""


def register(module_name: str) -> None:
    """Subcommands live in their own modules (train, allocate, probe, bench, ...)."""
    import importlib
    module = importlib.import_module(f"bno_hvd.commands.{module_name}")
    for command in module.COMMANDS:
        main.add_command(command)


for _name in ("train", "allocate", "hostfile", "bench", "docs", "experiment"):
    register(_name)


def echo_json(obj) -> None:
    click.echo(json.dumps(obj))
