"""``bno-hvd elastic -n N -- train ...`` (or ``-- python script.py``, a script of ``bno.elastic``): an
elastic job (:mod:`bno_hvd.processes.elasticagent`)."""

from __future__ import annotations

import sys

import click

from bno_hvd.common.errors import UsageError


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-n", "--nproc", type=int, required=True, help="Workers at the start.")
@click.option("--min-ranks", type=int, default=1, show_default=True, help="The fewest workers the job goes on with.")
@click.option("--max-ranks", type=int, default=None, help="The most workers it takes (default: --nproc).")
@click.option("--timeout", type=float, default=86400.0, show_default=True, help="Seconds the whole job may take.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def elastic(nproc, min_ranks, max_ranks, timeout, command):
    """Run `bno-hvd train --engine torch --elastic ...`, or a script of bno.elastic
    (`-- python script.py ...`), on NPROC local workers that may leave and join.

    A worker that ends (SIGKILL) or is sent SIGTERM is dropped; SIGUSR1 to this process starts one
    more, which joins at the next update boundary. Survivors are not restarted (docs/elastic.md)."""
    from bno_hvd.processes.elasticagent import ElasticAgent

    max_ranks = nproc if max_ranks is None else max_ranks
    if not 1 <= min_ranks <= nproc <= max_ranks:
        raise UsageError(f"need 1 <= --min-ranks <= --nproc <= --max-ranks, got {min_ranks}, {nproc}, {max_ranks}")
    worker = list(command)  # a script's own command line (bno.elastic: docs/elastic.md)
    if command[0] == "train":
        worker = [sys.executable, "-m", "bno_hvd", *command]
        if "--elastic" not in command:
            worker.append("--elastic")
        check_flags(worker[4:])  # (after "train")
    agent = ElasticAgent(worker, nproc, min_ranks=min_ranks, max_ranks=max_ranks, timeout=timeout)
    sys.exit(agent.run())


def check_flags(args: list[str]) -> None:
    """The workers' ``train`` flags, checked here once (one line, exit 2) before any worker starts."""
    from bno_hvd.cli.flags import config_from_flags
    from bno_hvd.cli.train import train

    params = train.make_context("train", list(args)).params
    config_from_flags(**{k: v for k, v in params.items() if k not in ("dry_run", "world_size")})


COMMANDS = [elastic]
