"""The mpi4py control plane: gather to rank 0, allocate, broadcast; latency probing; the
background monitor. With :mod:`bno_hvd.world`, the only code that talks MPI directly."""
