"""RUNS THE METHOD: MPI and Horovod in every rank, the control plane, the Balancer, the DataLoader,
checkpoints, devices and the training loop. May import :mod:`bno_hvd.common`,
:mod:`bno_hvd.allocation` and :mod:`bno_hvd.data`; never the lab or the CLI (lab behaviour
enters a run through a :class:`~bno_hvd.runtime.hooks.Plugin`).

The Balancer (the public step API) and its parts:

- :mod:`.balancer` - ``start_step`` / ``end_compute`` / ``end_step``, slices and loss weights
- :mod:`.timing` - one rank's clock: gap, compute, sync, CPU
- :mod:`.cpulimit` - the cgroup CPU limit a rank runs under, and whether it binds
- :mod:`.control` - the control plane (mpi4py): reports, gather, allocate, broadcast; latency, memory
- :mod:`.loader` - the DataLoader of a rank's slices (through a small :class:`~.loader.LoaderFeed`)
- :mod:`.checkpoint` - model, optimizer, balancer and RNG state, written atomically

The drop-in surface for a Horovod script (nothing to call inside its loop): :mod:`.dropin`
(``Balancer.for_world``, ``DataLoader``, ``DistributedOptimizer``, one-line errors) and
:mod:`.dropout` (dropout masks per global sample, so that N ranks equal one process).

Processes and devices: :mod:`.world` (MPI, then Horovod), :mod:`.gloo` (Horovod over Gloo in an
MPI job), :mod:`.mpienv` (MPI settings in a rank), :mod:`.heap` (malloc thresholds),
:mod:`.collector` (the setup kept out of Python's garbage collections),
:mod:`.collectives` (waits that sleep), :mod:`.device` (CPU/GPU, ``--amp``).

Text: :mod:`.tasks` (images or text: batches, loss, score), :mod:`.calibrate` (the cost of a
sequence, measured at start-up), :mod:`.textrules` (the text flags' checks).

The training loop: :mod:`.config` (one frozen dataclass, validated by a table) ->
:mod:`.components` (builds a run) -> :mod:`.loop` (the update loop) with :mod:`.hooks`,
:mod:`.evaluation`, :mod:`.clock`; what a run writes: :mod:`.records`, :mod:`.runlog`,
:mod:`.runstats`, :mod:`.stragglers`, :mod:`.tensorboard`.
"""
