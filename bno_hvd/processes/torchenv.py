"""torch.distributed in a job: under ``torchrun`` (its environment), or under mpirun/srun (set up
from the MPI world), for the torch engine (``--engine torch``, :func:`bno_hvd.DistributedDataParallel`).

``torchrun`` gives every process the ``env://`` variables (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``) and hosts the rendezvous store itself. Under mpirun there is no
such store: :func:`env_from_mpi` makes one, on rank 0, listening on the address of the interface
the ranks share (:func:`bno_hvd.processes.gloo.interface_for`: ``lo`` on one host), with a port
the kernel picks, and tells every rank through MPI; then ``init_process_group()`` joins it as
under torchrun (every rank a client of a store that is already there, as torchrun's agent store).

A DDP script written for torchrun runs under mpirun unchanged through this module::

    mpirun -np 4 python -m bno_hvd.processes.torchenv examples/ddp_mnist.py
"""

from __future__ import annotations

import atexit
import os
import runpy
import socket
import sys
import threading

from bno_hvd.common.errors import UsageError
from bno_hvd.processes.gloo import interface_for, placement
from bno_hvd.processes.mpienv import env_count

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MPI_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "HOROVOD_RANK")
_STORES: list = []  # rank 0's rendezvous store: it lives as long as the job


def torchrun_world(environ=os.environ) -> bool:
    """True when torch.distributed's ``env://`` variables are set (``torchrun`` sets them)."""
    return all(environ.get(var) for var in TORCHRUN_VARS)


def mpi_launched(environ=os.environ) -> bool:
    """True when an MPI launcher (mpirun, horovodrun, srun with PMI/PMIx) started this process."""
    return env_count(environ, *MPI_VARS) is not None


def world_control_comm():
    """The control plane's communicator of this job: a duplicate of ``MPI.COMM_WORLD`` under an
    MPI launcher (mpirun, horovodrun, srun) or in a lone process; a
    :class:`~bno_hvd.processes.torchcomm.TorchComm` (its own Gloo group) where torch.distributed
    runs without an MPI launcher (torchrun)."""
    import torch.distributed as dist

    if not mpi_launched() and dist.is_available() and dist.is_initialized():
        from bno_hvd.processes.torchcomm import TorchComm

        return TorchComm()
    try:
        from mpi4py import MPI
    except ImportError:
        raise UsageError(
            "no job to join: under torchrun call torch.distributed.init_process_group() before the balancer; "
            "under mpirun install mpi4py (pip install mpi4py)"
        ) from None
    return MPI.COMM_WORLD.Dup()


def env_from_mpi(comm, environ=os.environ) -> dict:
    """Collective over ``comm`` (the MPI world): set the ``env://`` variables, so that every rank's
    ``torch.distributed.init_process_group()`` joins one job of the MPI world's ranks (and its
    Gloo binds the ranks' shared interface). Returns the variables set."""
    from torch.distributed import TCPStore

    hosts = comm.allgather(socket.gethostname())
    rank, size = comm.Get_rank(), comm.Get_size()
    try:
        iface, address = interface_for(len(set(hosts)) == 1, environ)
        error = None
    except UsageError as err:
        iface = address = None
        error = str(err).replace("--collectives gloo", "--engine torch")
    errors = comm.allgather(error)
    if any(errors):
        raise UsageError(next(e for e in errors if e))
    port = None
    if rank == 0:
        store = TCPStore(address, 0, size, is_master=True, wait_for_workers=False)
        _STORES.append(store)
        port = store.port
    address, port = comm.bcast((address, port), root=0)
    place = placement(hosts)[rank]
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_RANK": str(place["HOROVOD_LOCAL_RANK"]),
        "LOCAL_WORLD_SIZE": str(place["HOROVOD_LOCAL_SIZE"]),
        "MASTER_ADDR": address,
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # every rank joins the store above as a client
    }
    if "GLOO_SOCKET_IFNAME" not in environ:
        env["GLOO_SOCKET_IFNAME"] = iface
    environ.update(env)
    return env


def init_process_group(backend: str, environ=os.environ) -> str:
    """Start torch.distributed in this rank with ``backend`` (gloo, nccl): from torchrun's
    variables, else from the MPI world (:func:`env_from_mpi`). Returns the launch: torchrun or mpi."""
    import torch.distributed as dist

    launch = "torchrun"
    if not torchrun_world(environ) or mpi_launched(environ):
        from mpi4py import MPI

        env_from_mpi(MPI.COMM_WORLD, environ)
        launch = "mpi"
    dist.init_process_group(backend)
    finish_at_exit()
    return launch


def finish_at_exit() -> None:
    """Register :func:`finish_process_group` at exit, once (``at_exit=True``)."""
    if not _AT_EXIT:
        atexit.register(finish_process_group, at_exit=True)
        _AT_EXIT.append(finish_process_group)


_AT_EXIT: list = []  # finish_process_group once registered at exit


def finish_process_group(at_exit: bool = False, wait: float = 5.0) -> None:
    """Destroy torch.distributed's process groups, if any, while the interpreter is whole (torch asks
    every script to; registered at exit by :func:`init_process_group`). Without it a Gloo worker
    thread may free a finished collective's tensors during the interpreter's finalization and abort
    the rank after its work ("terminate called without an active exception", pytorch/pytorch#190489:
    the worker takes the GIL after finalization began and is unwound through a destructor). Models
    that died with the script's functions go first (a DDP model freed after its group hangs:
    pytorch/pytorch#56297), and last the groups the DDP drop-in kept for models that are gone (else
    freed in the finalization, where a worker thread that frees a tensor aborts the rank the same
    way). ``at_exit``: when an uncaught exception ends this rank, the groups are destroyed in a
    thread this rank waits for at most ``wait`` seconds (a collective still waiting for a peer
    holds the destruction until the group's timeout; the rank then exits without it)."""
    import gc

    import torch.distributed as dist

    gc.collect()
    if dist.is_available() and dist.is_initialized():
        if not at_exit or not hasattr(sys, "last_value"):
            dist.destroy_process_group()
        else:
            ending = threading.Thread(target=dist.destroy_process_group, daemon=True)
            ending.start()
            ending.join(wait)
    ddp = sys.modules.get("bno_hvd.library.ddp")
    if ddp is not None:
        ddp.release_kept_groups()


def main(argv=None) -> None:
    """``python -m bno_hvd.processes.torchenv SCRIPT [ARGS]`` under mpirun: a torchrun script, run as
    torchrun would start it (its ``init_process_group()`` reads the variables set here)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.exit("usage: mpirun -np N python -m bno_hvd.processes.torchenv SCRIPT [ARGS]")
    from mpi4py import MPI

    env_from_mpi(MPI.COMM_WORLD)
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
