"""The control plane (with :mod:`bno_hvd.processes.world`, the only code that talks MPI directly):
mpi4py, or under torchrun torch.distributed on a Gloo group (:mod:`bno_hvd.processes.torchcomm`,
the same calls).
Part of the library: may import what :mod:`bno_hvd.library` may.

- :mod:`.controller` - one rank's side: its report, the plan of allocations every rank holds
- :mod:`.plane` - gather the reports to rank 0, allocate there, broadcast the sizes
- :mod:`.monitor` - memory and latency measured on a background thread, on its own communicator
- :mod:`.latency`, :mod:`.schedule` - ping-pong round trips, and which pairs meet in which round
- :mod:`.probe` - ``bno-hvd probe``: OPS, memory and the latency matrix of every rank
"""
