"""The ``bno-hvd`` command (a click group); each subcommand lives in its own module of ``bno_hvd.cli``.

Every error a user can cause ends as one line on stderr and a non-zero exit, never a traceback:
:class:`UsageError` (exit 2) and :class:`TrainingError` (exit 1). A collective that fails because
another rank ended (Gloo notices a dead peer before mpirun stops the job) is one line too (exit 1).
Under MPI, an error every rank agrees on is printed by rank 0 alone; an error only one rank
found (``err.rank`` is set) is printed by that rank, and the job is aborted so that no other
rank waits for it.
"""

from __future__ import annotations

import os
import sys

import click

from bno_hvd.cli import agent, allocate, bench, console, docs, experiment, hostfile, ledgercheck, simulate, train, tta
from bno_hvd.common.errors import TrainingError, UsageError
from bno_hvd.common.parsing import clip
from bno_hvd.processes.world import exit_with_error, launched_rank


def fail(message: str, code: int = 2, *, only_this_rank: int | None = None):
    exit_with_error(message, code, only_this_rank=only_this_rank)


class Group(click.Group):
    """Turns UsageError, TrainingError and click's own usage errors into one line."""

    def main(self, *args, **kwargs):
        kwargs.setdefault("standalone_mode", False)
        try:
            return super().main(*args, **kwargs)
        except (UsageError, TrainingError) as err:
            fail(str(err), err.exit_code, only_this_rank=err.rank)
        except click.exceptions.Exit as err:
            sys.exit(err.exit_code)
        except click.Abort:
            fail("aborted", 130)
        except click.ClickException as err:  # click repeats the user's value whole: one short line
            fail(clip(err.format_message()), err.exit_code)
        except Exception as err:
            if not raised_in_horovod(err):
                raise
            # another rank ended (killed, crashed): Gloo tells this rank before mpirun stops it
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            fail(
                f"Horovod's collectives failed ({clip(first)}); another rank probably ended first",
                1,
                only_this_rank=launched_rank(),
            )


def raised_in_horovod(err: BaseException) -> bool:
    """Whether ``err`` came out of Horovod's own code (a collective that can no longer complete)."""
    tb = err.__traceback__
    while tb is not None:
        if f"{os.sep}horovod{os.sep}" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return type(err).__name__ == "HorovodInternalError"


@click.group(cls=Group)
@click.version_option(package_name="bno-hvd")
def main():
    """bno-hvd: heterogeneity-aware data-parallel training on Horovod (BalanceNet allocation)."""


for _module in (train, allocate, hostfile, bench, console, docs, experiment, tta, simulate, ledgercheck, agent):
    for _command in _module.COMMANDS:
        main.add_command(_command)
