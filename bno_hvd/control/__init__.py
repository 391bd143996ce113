"""The mpi4py control plane: the only package (with ``bno_hvd.hvd``) that talks MPI."""
