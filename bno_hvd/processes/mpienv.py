"""The MPI settings bno-hvd runs with, applied inside every rank before MPI starts.

Why ``OMPI_MCA_mpi_yield_when_idle``: ranks that share cores (4 ranks on 2 cores here; several
ranks per core on a shared node) otherwise busy-poll in MPI and take the cores from the ranks
that compute. Measured on this 2-core machine (4 ranks, CNN, ``bench --emulate-speed
1,1,1,0.33``): about 80 ms of every ~280 ms update went outside compute without it, ~10 ms with
it; ``balanced`` reached 2.07x ``equal`` without it and 2.37x with it.
:func:`arrange_for_shared_cores` sets it in a rank where ranks outnumber the cores and the user
chose nothing, so a plain ``horovodrun`` gets it too. The launchers (:mod:`bno_hvd.cli.launching`,
``launch/mpi-env``) export :data:`MPI_SETTINGS` for the whole job.
"""

from __future__ import annotations

import os

# Settings for Open MPI in containers and on shared cores (see ../shared/install-notes.md).
MPI_SETTINGS = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",  # containers run as root
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",  # no CMA in containers
    "OMPI_MCA_mpi_yield_when_idle": "1",  # ranks share cores
    "OMPI_MCA_rmaps_base_oversubscribe": "1",  # 4 ranks on 2 cores
    "PYTHONUNBUFFERED": "1",
}
# One thread per rank unless the user chose otherwise.
THREAD_DEFAULTS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
YIELD = "OMPI_MCA_mpi_yield_when_idle"


def mpi_env(base: dict | None = None, extra: dict | None = None) -> dict:
    """``base`` (default: this process's environment) with :data:`MPI_SETTINGS` and ``extra``."""
    env = dict(os.environ if base is None else base)
    env.update(MPI_SETTINGS)
    for key, value in THREAD_DEFAULTS.items():
        env.setdefault(key, value)
    env.update(extra or {})
    return env


def usable_cores() -> int:
    """CPU cores this process may run on (affinity mask; cgroup quotas are not cores)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def env_count(environ, *names: str) -> int | None:
    """The first of ``names`` set to a plain decimal count (at most 7 ASCII digits), else None.

    Launchers set these; anything else (Slurm's ``2(x3)``, a stray value, digits such as ``²``
    that ``int`` refuses) is treated as not set rather than failing inside MPI start-up."""
    for var in names:
        value = environ.get(var, "")
        if value.isascii() and value.isdigit() and len(value) <= 7:
            return int(value)
    return None


def ranks_on_this_host(environ=os.environ) -> int | None:
    """How many ranks the launcher started on this host (None when not under a known launcher)."""
    return env_count(
        environ, "OMPI_COMM_WORLD_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"
    )


def arrange_for_shared_cores(environ=os.environ) -> str | None:
    """Before MPI starts in this process: when ranks outnumber this host's cores and the user
    has not chosen ``mpi_yield_when_idle``, set it (Open MPI reads its ``OMPI_MCA_*`` settings
    from the environment when MPI is initialised). Returns a note for the log, or None."""
    local = ranks_on_this_host(environ)
    cores = usable_cores()
    if local is None or local <= cores or YIELD in environ:
        return None
    environ[YIELD] = "1"
    return (
        f"{local} ranks share {cores} core{'s' if cores != 1 else ''} on this host and {YIELD} was not set: "
        "bno-hvd set it to 1 for this run, so that waiting ranks do not busy-poll the cores away from "
        "computing ones (measured: balanced 2.18x -> 2.40x equal, EMULATED 1,1,1,0.33)"
    )
