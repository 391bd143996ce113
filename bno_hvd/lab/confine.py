"""Start a rank the way a container or a Slurm job step does: already inside its cgroup, on its CPUs.

The REAL profile suite (:mod:`bno_hvd.lab.profiles`) sets CPU limits *outside* bno-hvd: it makes
one cgroup per rank with a CFS quota and launches every rank through this wrapper, which moves
the process into its rank's cgroup and onto its CPUs and then ``exec``s the command. bno-hvd
inside knows nothing of it; it only reads the limit, as it would under Docker's ``--cpus`` or
Slurm's cgroup plugin (:func:`bno_hvd.processes.cpulimit.cpu_limit`).

Usage (under mpirun; one entry per rank, ``-`` for none)::

    BNO_CONFINE_CGROUPS=/sys/fs/cgroup/cpu/a,/sys/fs/cgroup/cpu/b,-,- BNO_CONFINE_CPUS=0,0,1,1 \\
        python -m bno_hvd.lab.confine bno-hvd bench ...
"""

from __future__ import annotations

import os
import sys

from bno_hvd.processes.world import launched_rank

CGROUPS = "BNO_CONFINE_CGROUPS"
CPUS = "BNO_CONFINE_CPUS"


def entry_for(value: str, rank: int) -> str | None:
    """This rank's entry of a comma-separated per-rank list (None: empty, ``-``, or no entry)."""
    items = value.split(",") if value else []
    item = items[rank].strip() if rank < len(items) else ""
    return None if item in ("", "-") else item


def confine(rank: int, environ=os.environ) -> None:
    """Move this process into its rank's cgroup and onto its CPUs (``+``-separated CPU numbers)."""
    group = entry_for(environ.get(CGROUPS, ""), rank)
    if group is not None:
        with open(os.path.join(group, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    cpus = entry_for(environ.get(CPUS, ""), rank)
    if cpus is not None:
        os.sched_setaffinity(0, {int(c) for c in cpus.split("+")})


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m bno_hvd.lab.confine COMMAND [ARGS...]", file=sys.stderr)
        return 2
    try:
        confine(launched_rank())
    except (OSError, ValueError) as err:
        print(f"bno-hvd: error: cannot confine rank {launched_rank()}: {err}", file=sys.stderr)
        return 1
    os.execvp(argv[0], argv)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
