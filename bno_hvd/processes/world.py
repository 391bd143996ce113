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

import atexit
import os
import sys
import time
from dataclasses import dataclass, replace

from bno_hvd.common.errors import TrainingError, UsageError, import_horovod
from bno_hvd.processes.cpulimit import cpu_limit
from bno_hvd.processes.gloo import close_rendezvous, init_gloo_env
from bno_hvd.processes.heap import keep_freed_memory
from bno_hvd.processes.mpienv import arrange_for_shared_cores, env_count, usable_cores
from bno_hvd.processes.sitsets import SitOutSets

COLLECTIVES = ("auto", "mpi", "gloo")


def launched_rank(environ=os.environ) -> int:
    """This process's rank from the launcher's environment (mpirun's, srun's, torchrun's; else 0)."""
    launchers = ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK")
    rank = env_count(environ, *launchers, "BNO_ELASTIC_ID")  # an elastic worker's id (membership.ID_ENV)
    return rank or 0


def exit_with_error(message: str, code: int, *, only_this_rank: int | None = None):
    """End this process with one ``bno-hvd: error:`` line on stderr and exit ``code``.

    An error every rank agrees on is printed by rank 0 alone; one that only this rank found
    (``only_this_rank``) is printed by it with its rank, and the MPI job is aborted so that no
    other rank waits for it in a collective. Used by the CLI and by a user's script (the drop-in)."""
    if only_this_rank is not None:
        who = "worker" if "BNO_ELASTIC_ID" in os.environ else "rank"  # an elastic worker: its job-wide id
        _say(f"bno-hvd: error: {who} {only_this_rank}: {message}")
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1:
            mpi.COMM_WORLD.Abort(code)  # the others may be waiting for this rank in a collective
        sys.exit(code)
    if launched_rank() == 0:
        _say(f"bno-hvd: error: {message}")
    sys.exit(code)


def one_line_errors() -> None:
    """Make a :class:`UsageError` or :class:`TrainingError` that ends the script one
    ``bno-hvd: error:`` line on stderr (rank 0's, or the rank that alone found it, which then
    aborts the job so no rank waits for it) and exit code 2 or 1, as the CLI does. Other
    exceptions keep Python's report. Installed by the drop-in constructors (:mod:`bno_hvd.library`); idempotent."""
    if getattr(sys.excepthook, "bno_hvd", False):
        return
    previous = sys.excepthook

    def hook(kind, err, traceback):
        if not isinstance(err, (UsageError, TrainingError)):
            return previous(kind, err, traceback)
        exit_with_error(str(err), err.exit_code, only_this_rank=err.rank)

    hook.bno_hvd = True
    sys.excepthook = hook


def _say(line: str) -> None:
    """One write per line: under mpirun a rank's tag cannot land between the line and its newline."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


@dataclass
class World:
    hvd: object  # the horovod.torch module
    rank: int
    size: int
    local_rank: int
    control_comm: object  # mpi4py communicator of the control plane
    monitor_comm: object  # mpi4py communicator of the latency monitor
    notes: list[str]  # what start-up arranged, for run.json
    collectives: str = "mpi"  # what Horovod's allreduce runs on: mpi or gloo (auto resolved)
    # the process sets (Horovod) or groups (torch) of the ranks that compute, by the ranks that sit
    # out (None: one rank, none can)
    sit_out_sets: SitOutSets | None = None
    engine: str = "horovod"  # or torch: hvd is then bno_hvd.processes.torchworld.TorchCollectives
    members: list | None = None  # --elastic: the worker id of each rank (bno_hvd.processes.membership)

    @property
    def master(self) -> bool:
        return self.rank == 0

    def fork(self) -> World:
        """Collective: the same job with its own control-plane and monitor communicators, for a
        run that stays alive beside others (``bench --rounds``), so their messages never mix."""
        monitor = None if self.monitor_comm is None else self.monitor_comm.Dup()  # None: no latency probe
        return replace(self, control_comm=self.control_comm.Dup(), monitor_comm=monitor)

    def abort(self, code: int) -> None:
        """End every rank of the job now (an error only this rank knows about)."""
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(code)


def init_world(
    collectives: str = "mpi", device: str = "auto", throttled: bool = False, engine: str = "horovod"
) -> World:
    """Initialise MPI and Horovod in this rank; raises :class:`UsageError` for a wrong launch.
    ``engine="torch"``: torch.distributed instead (:func:`bno_hvd.processes.torchworld.start_torch`).

    ``collectives``: what Horovod's allreduce runs on, ``mpi``, ``gloo``
    (:mod:`bno_hvd.processes.gloo`) or ``auto`` (:func:`choose_collectives`; ``device`` and
    ``throttled``, whether bno-hvd will put the ranks under CPU quotas, inform it); the control
    plane always talks MPI."""
    if engine == "torch":
        from bno_hvd.processes.torchworld import start_torch

        hvd, rank, size, local_rank, control, monitor, notes, backend = start_torch(device, collectives)
        world = World(hvd, rank, size, local_rank, control, monitor, notes, backend, engine="torch")
        world.sit_out_sets = SitOutSets.torch(size) if size > 1 else None
        return world
    hvd, comm, collectives, notes, sets = start_horovod(collectives, device, throttled, sit_out_sets=True)
    world = World(hvd, hvd.rank(), hvd.size(), hvd.local_rank(), comm.Dup(), comm.Dup(), notes, collectives)
    world.sit_out_sets = sets
    return world


def start_horovod(collectives: str = "auto", device: str = "auto", throttled: bool = False, sit_out_sets=False):
    """MPI (mpi4py, with ``mpi_yield_when_idle`` where ranks share cores), then Horovod in the
    same world, on ``collectives`` (``auto``: :func:`choose_collectives`); rank 0 prints the notes.
    Returns ``(hvd, MPI.COMM_WORLD, collectives, notes, sets)``: ``sets`` the :class:`SitOutSets`
    of Horovod process sets when ``sit_out_sets`` (bno-hvd's loop), else None. Collective."""
    notes = [n for n in [arrange_for_shared_cores()] if n]
    keep_freed_memory()  # no page faults on every update's activations (bno_hvd/processes/heap.py)
    hvd = import_horovod()
    from mpi4py import MPI  # initialises MPI (after the environment above is final)

    comm = MPI.COMM_WORLD
    auto = collectives == "auto"
    if auto:
        collectives, why = choose_collectives(comm.allgather(spins_cost_compute(device, throttled)))
        if collectives != "mpi":  # MPI is what a plain Horovod job runs on: nothing to say (run.json has it)
            notes.append(f"--collectives auto: {collectives} ({why})")
    if collectives == "gloo":
        if init_gloo_env(comm, required=not auto) is None:
            collectives = "mpi"
            notes.append("--collectives auto: mpi after all (no network interface for Gloo could be told)")
        else:
            where = f"{os.environ['HOROVOD_GLOO_RENDEZVOUS_ADDR']}:{os.environ['HOROVOD_GLOO_RENDEZVOUS_PORT']}"
            notes.append(
                "Horovod's collectives run on Gloo (TCP, waits in the kernel; interface "
                f"{os.environ['HOROVOD_GLOO_IFACE']}, rendezvous on {where} until every rank joined); "
                "the control plane on MPI"
            )
    # any ranks but 0 may sit an update out: the process sets of the others (sitsets.py)
    gloo = comm.Dup() if collectives == "gloo" and comm.Get_size() > 1 else None  # (a new start's rendezvous)
    sets = None
    if sit_out_sets and comm.Get_size() > 1:
        sets = SitOutSets.horovod(hvd, comm.Get_size(), lambda s: _start_again(hvd, s, gloo), comm.Dup().Barrier)
    hvd.init(process_sets=None if sets is None else sets.static())
    if collectives == "gloo":
        close_rendezvous(comm)  # the rendezvous store is needed only while the ranks join
    if comm.Get_size() != hvd.size():
        raise UsageError(
            f"mpi4py sees {comm.Get_size()} ranks but Horovod sees {hvd.size()}; "
            "launch with horovodrun --mpi (not --gloo) or mpirun"
        )
    if hvd.rank() == 0:
        for note in notes:  # once per job, where the user sees it (and in every run.json)
            print(f"bno-hvd: note: {note}", file=sys.stderr, flush=True)
    return hvd, comm, collectives, notes, sets


def _start_again(hvd, process_sets: list, gloo_comm) -> None:
    """Horovod initialised again with these static process sets (after ``hvd.shutdown``; collective);
    on Gloo its ranks meet at a rendezvous store open meanwhile."""
    if gloo_comm is None:
        hvd.init(process_sets=process_sets)
        return
    from bno_hvd.processes.gloo import rendezvous_open

    with rendezvous_open(gloo_comm):
        hvd.init(process_sets=process_sets)


EXIT_WAIT_SECONDS = 60.0  # how long a rank at its exit waits for the others (leave_together)


def leave_together(seconds: float = EXIT_WAIT_SECONDS) -> None:
    """Register an exit hook: a rank that ends waits (at most ``seconds``) in a Horovod collective
    until every rank has ended too, before Horovod's own exit hook shuts Horovod down.

    Why: when the script's ``hvd.init()`` started MPI, Horovod also finalizes it, and the first
    rank whose Horovod shuts down shuts it down on every rank: each then finalizes MPI under
    whatever its main thread still does (a rank still building its Balancer crashed in
    ``MPI_Comm_size``). The wait is Horovod's own allreduce, not MPI's: after it, no rank makes
    another MPI call before its shutdown. Registered after ``hvd.init()``, so it runs first.
    Skipped when an uncaught exception ends this rank alone: the others may wait for it in an
    allreduce, and Horovod's shutdown is what frees them. Not for a one-line error every rank
    raised (rank 0's failed allocation, broadcast): the ranks that ended first finalized MPI under
    rank 0 while it still unwound from it (seen 1.5 s after; likely the segfault of rank 0 there
    in one of four fresh-clone CI runs).
    Registered once per process (a second Balancer adds no second wait)."""
    global _LEAVING
    if not _LEAVING:
        atexit.register(_wait_for_the_others, seconds)
        _LEAVING = True


_LEAVING = False  # leave_together's hook is registered


def _wait_for_the_others(seconds: float) -> None:
    hvd = sys.modules.get("horovod.torch")
    alone = hasattr(sys, "last_value") and not every_rank_raised(sys.last_value)
    if alone or hvd is None or not hvd.is_initialized() or hvd.size() < 2:
        return
    import torch

    try:
        handle = hvd.allreduce_async(torch.zeros(1), name="bno_hvd.exit", op=hvd.Sum)
        deadline = time.monotonic() + seconds
        while not hvd.poll(handle):
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        hvd.synchronize(handle)
    except Exception:  # noqa: BLE001 - another rank's Horovod shut down first: nothing to wait for
        return


def every_rank_raised(err) -> bool:
    """A :class:`UsageError` or :class:`TrainingError` that no one rank found alone: every rank raises it."""
    return isinstance(err, (UsageError, TrainingError)) and err.rank is None


def spins_cost_compute(device: str = "auto", throttled: bool = False) -> str | None:
    """Why MPI's busy-polling waits would take CPU this rank needs to compute, or None.

    They do where a rank runs under a CPU limit (a container's or Slurm's quota, or bno-hvd's
    ``--cpu-quota``): a waiting rank spends its quota polling, and a throttled rank answers the
    allreduce late. Ranks that merely share cores are not counted: with
    ``mpi_yield_when_idle`` (set by :func:`bno_hvd.processes.mpienv.arrange_for_shared_cores`) MPI
    was faster there (Gloo ran 0.83x MPI, paired runs). Not for GPU tensors either
    (their allreduce does not run on the CPU's collectives)."""
    if device == "cuda" or (device == "auto" and _cuda_available()):
        return None
    limit = cpu_limit()
    if throttled or (limit is not None and limit < usable_cores()):
        return "ranks run under a CPU limit"
    return None


def choose_collectives(reasons: list[str | None]) -> tuple[str, str]:
    """``auto``'s choice from every rank's :func:`spins_cost_compute` (pure): gloo when any rank's
    spinning would cost compute, MPI otherwise (no CPU limit: MPI's fast paths win)."""
    found = [(rank, why) for rank, why in enumerate(reasons) if why]
    if not found:
        return "mpi", "no rank runs under a CPU limit"
    rank, why = found[0]
    return "gloo", f"rank {rank}: {why}; Gloo's waits sleep where MPI's spin"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
