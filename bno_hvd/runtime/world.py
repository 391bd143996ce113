"""Start MPI and Horovod in a rank, and describe the job: the one module that initialises them.

MPI comes first, with ``MPI_THREAD_MULTIPLE`` (mpi4py's default), because the metrics monitor
talks MPI from a background thread; Horovod then joins the same MPI world. The control plane
and the monitor each get their own duplicated communicator, so their messages never mix with
each other's or Horovod's.

Usage::

    world = init_world()            # under horovodrun --mpi / mpirun / srun
    world.rank, world.size, world.local_rank
    world.hvd.allreduce(...)
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from bno_hvd.common.errors import UsageError
from bno_hvd.runtime.gloo import init_gloo_env
from bno_hvd.runtime.heap import keep_freed_memory
from bno_hvd.runtime.mpienv import arrange_for_shared_cores, env_count


def launched_rank(environ=os.environ) -> int:
    """This process's rank from the launcher's environment (0 when not under MPI)."""
    rank = env_count(environ, "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
    return rank or 0


@dataclass
class World:
    hvd: object  # the horovod.torch module
    rank: int
    size: int
    local_rank: int
    control_comm: object  # mpi4py communicator of the control plane
    monitor_comm: object  # mpi4py communicator of the latency monitor
    notes: list[str]  # what start-up arranged, for run.json

    @property
    def master(self) -> bool:
        return self.rank == 0

    def abort(self, code: int) -> None:
        """End every rank of the job now (an error only this rank knows about)."""
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(code)


def init_world(collectives: str = "mpi") -> World:
    """Initialise MPI and Horovod in this rank; raises :class:`UsageError` for a wrong launch.

    ``collectives``: what Horovod's allreduce runs on, ``mpi`` or ``gloo``
    (:mod:`bno_hvd.runtime.gloo`); the control plane always talks MPI."""
    notes = [n for n in [arrange_for_shared_cores()] if n]
    keep_freed_memory()  # no page faults on every update's activations (bno_hvd/runtime/heap.py)
    import horovod.torch as hvd
    from mpi4py import MPI  # initialises MPI (after the environment above is final)

    if collectives == "gloo":
        init_gloo_env(MPI.COMM_WORLD)
        notes.append("Horovod's collectives run on Gloo (TCP, waits in the kernel); the control plane on MPI")
    hvd.init()
    world = MPI.COMM_WORLD
    if world.Get_size() != hvd.size():
        raise UsageError(
            f"mpi4py sees {world.Get_size()} ranks but Horovod sees {hvd.size()}; "
            "launch with horovodrun --mpi (not --gloo) or mpirun"
        )
    if hvd.rank() == 0:
        for note in notes:  # once per job, where the user sees it (and in every run.json)
            print(f"bno-hvd: note: {note}", file=sys.stderr, flush=True)
    return World(hvd, hvd.rank(), hvd.size(), hvd.local_rank(), world.Dup(), world.Dup(), notes)
