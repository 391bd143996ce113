"""``bno-hvd console -- COMMAND...``: run an mpirun/horovodrun job and show what matters of its output."""

from __future__ import annotations

import sys

import click


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def console(command):
    """Run COMMAND (a horovodrun/mpirun job) and show rank 0's output without mpirun's
    `[1,0]<stdout>:` tags: a progress bar on a terminal (a line every 10% otherwise), errors and
    warnings of any rank once; exits with the job's exit code. launch/run uses it."""
    from ..console import run_job

    sys.exit(run_job(list(command)))


COMMANDS = [console]
