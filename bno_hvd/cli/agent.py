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
@click.option("--nnodes", type=int, default=1, show_default=True, help="Machines at the start, an agent on each.")
@click.option("--node-rank", type=int, default=0, show_default=True, help="This machine's; 0 hosts the store.")
@click.option("--store", "address", default=None, help="HOST:PORT of node 0's store (needed with several nodes).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def elastic(nproc, min_ranks, max_ranks, timeout, nnodes, node_rank, address, command):
    """Run `bno-hvd train --engine torch --elastic ...`, or a script of bno.elastic
    (`-- python script.py ...`), on NPROC workers per machine that may leave and join.

    A worker that ends (SIGKILL) or is sent SIGTERM is dropped; SIGUSR1 to an agent starts one
    more on its machine, which joins at the next update boundary. Several machines: an agent on
    each, node 0 first or not; a machine whose agent goes silent is dropped with its workers.
    Survivors are not restarted (docs/elastic.md)."""
    max_ranks = nproc * nnodes if max_ranks is None else max_ranks
    if not 1 <= min_ranks <= nproc * nnodes <= max_ranks:
        got = f"{min_ranks}, {nproc * nnodes}, {max_ranks}"
        raise UsageError(f"need 1 <= --min-ranks <= --nproc x --nnodes <= --max-ranks, got {got}")
    if (nnodes > 1 or node_rank) and not address:
        raise UsageError("several nodes need --store HOST:PORT: node 0's address, which every machine reaches")
    if address and not address.rpartition(":")[2].isdigit():
        raise UsageError(f"--store needs HOST:PORT, got {address!r}")
    worker = list(command)  # a script's own command line (bno.elastic: docs/elastic.md)
    if command[0] == "train":
        worker = [sys.executable, "-m", "bno_hvd", *command]
        if "--elastic" not in command:
            worker.append("--elastic")
        check_flags(worker[4:])  # (after "train")
    sys.exit(run_agent(worker, nproc, min_ranks, max_ranks, timeout, nnodes, node_rank, address))


def run_agent(worker, nproc, min_ranks, max_ranks, timeout, nnodes, node_rank, address) -> int:
    """Node 0's agent (the store, the memberships), or another node's (its workers, reported)."""
    if node_rank == 0:
        from bno_hvd.processes.elasticagent import ElasticAgent

        agent = ElasticAgent(
            worker, nproc, min_ranks=min_ranks, max_ranks=max_ranks, timeout=timeout, address=address, nnodes=nnodes
        )
        return agent.run()
    import datetime

    import torch.distributed as dist

    from bno_hvd.processes.elasticnode import Node, serve

    host, _, port = address.rpartition(":")
    try:  # waits for node 0's store as long as the job may take to start
        store = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=60))
    except (RuntimeError, OSError) as err:
        raise UsageError(f"cannot reach node 0's store at {address}: {str(err).splitlines()[0]}") from None
    return serve(Node(worker, store, address, node_rank), nproc, timeout)


def check_flags(args: list[str]) -> None:
    """The workers' ``train`` flags, checked here once (one line, exit 2) before any worker starts."""
    from bno_hvd.cli.flags import config_from_flags
    from bno_hvd.cli.train import train

    params = train.make_context("train", list(args)).params
    config_from_flags(**{k: v for k, v in params.items() if k not in ("dry_run", "world_size")})


COMMANDS = [elastic]
