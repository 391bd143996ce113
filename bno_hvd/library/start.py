"""``bno.init()``: the drop-in for ``hvd.init()`` in a Horovod script.

Plain ``hvd.init()`` under ``mpirun`` runs Horovod's collectives on MPI, whose waits spin: on a rank
under a CPU limit (a container's or Slurm's quota) the spinning spends the quota the rank needs to
compute, and a throttled rank answers every allreduce late. bno-hvd's own loop starts Horovod on
Gloo there (its waits sleep in the kernel); ``bno.init()`` does the same for a script, which cannot
switch after its ``hvd.init()`` (Horovod's shutdown would end the MPI it started, and the control
plane with it). Where no rank runs under a limit it is ``hvd.init()`` on MPI, as before.

Usage::

    import horovod.torch as hvd
    import bno_hvd as bno
    bno.init()        # was: hvd.init(); then hvd.rank(), hvd.size(), ... as before
"""

from __future__ import annotations

from bno_hvd.common.arguments import describe
from bno_hvd.common.errors import UsageError
from bno_hvd.processes.world import COLLECTIVES, one_line_errors, start_horovod

__all__ = ["init"]


def init(collectives: str = "auto") -> None:
    """Start MPI and Horovod in this rank, as ``hvd.init()`` does, on the collectives that suit the
    machine; collective (every rank calls it once, before any other Horovod call). Rank 0 prints
    one ``bno-hvd: note:`` when it chose Gloo.

    Args:
        collectives: what Horovod's allreduce runs on: ``"auto"`` (Gloo where any rank runs under
            a CPU limit, else MPI), ``"mpi"`` (plain ``hvd.init()``) or ``"gloo"``. The control
            plane (mpi4py) talks MPI either way, so launch with ``mpirun`` or ``horovodrun --mpi``.

    Example::

        bno.init()                                  # was: hvd.init()
        torch.cuda.set_device(hvd.local_rank())     # hvd's functions work as after hvd.init()
        train_sampler = bno.Balancer.for_world(train_set, 32)
    """
    one_line_errors()
    if collectives not in COLLECTIVES:
        raise UsageError(f"bno.init: collectives is one of {', '.join(COLLECTIVES)}, got {describe(collectives)}")
    start_horovod(collectives)
