"""PROCESS PLUMBING: what every rank of a job needs before and around training - MPI, then
Horovod (or torch.distributed), their settings, memory and waiting. May import :mod:`bno_hvd.common` only.

- :mod:`.world` - MPI, then Horovod, in every rank; leaving together; one error line per job
- :mod:`.sitsets` - the process sets of the ranks that compute, made when a set of ranks first sits out
- :mod:`.gloo` - Horovod over Gloo inside an MPI job (its rendezvous)
- :mod:`.torchworld` - the torch engine's job: torch.distributed, the loop's collectives over it
- :mod:`.torchenv` - torch.distributed under torchrun or from the MPI world; the control plane's communicator
- :mod:`.torchcomm` - the control plane's communicator interface, and its torch.distributed (Gloo) one
- :mod:`.membership` - who is in an elastic job: its generations and each one's torch.distributed world
- :mod:`.elasticagent` - the elastic job's agent: starts and watches the workers, publishes memberships
- :mod:`.elasticnode` - one machine's part of an elastic job: its workers, reported through the store
- :mod:`.mpienv` - MPI settings in a rank (and ``launch/mpi-env``'s exports)
- :mod:`.heap` - malloc thresholds: freed memory stays in each rank's heap
- :mod:`.collector` - the setup kept out of Python's garbage collections
- :mod:`.collectives` - waits on collectives that sleep instead of spinning
- :mod:`.device` - CPU or GPU, mixed precision (``--amp``), the memory cap
- :mod:`.cpulimit` - the cgroup CPU limit a rank runs under, and whether it binds
"""
