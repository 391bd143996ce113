"""THE LIBRARY a user's script imports: the Balancer and its parts, the drop-in surface for a
Horovod script, and exact dropout and BatchNorm. May import :mod:`bno_hvd.common`, :mod:`bno_hvd.allocation`,
:mod:`bno_hvd.data` and :mod:`bno_hvd.processes`; never the training application, the lab or
the CLI.

The Balancer (the public step API) and its parts:

- :mod:`.balancer` - ``start_step`` / ``end_compute`` / ``end_step``, slices and loss weights
- :mod:`.samplerface` - what Horovod's ``DistributedSampler`` offers a script (``for_world``, ``set_epoch``, ``len``)
- :mod:`.step` - one update as one rank sees it (its slice, weight, micro-batches); ``TextOptions``
- :mod:`.sequences` - token sequences through ``for_world``: a sequence's measured cost, the split by it
- :mod:`.timing` - one rank's clock: gap, compute, sync, CPU
- :mod:`.control` - the control plane (mpi4py): reports, gather, allocate, broadcast; latency, memory
- :mod:`.loader` - the DataLoader of a rank's slices (through a small :class:`~.loader.LoaderFeed`)
- :mod:`.catchup` - the state a rank receives when it computes again after sitting out (bno-hvd's loop)
- :mod:`.sitout` - the same in a script's own loop: the drop-ins sit a rank with 0 samples out

The drop-in surface for a Horovod script (nothing to call inside its loop): :mod:`.start`
(``init``: Horovod started on the collectives that suit the machine), :mod:`.dropin`
(``DataLoader``, ``DistributedOptimizer``, one-line errors). So that N ranks equal one process:
:mod:`.dropout` (dropout masks per global sample; :mod:`.dropmask` computes them), :mod:`.batchnorm`
(BatchNorm by the global batch's statistics) and :mod:`.exact` (``bno.exact``: both in one call); for a DDP script,
:mod:`.ddp` (``DistributedDataParallel``: DDP whose communication hook weights each rank by its share).
The frameworks users train with (Lightning, Accelerate, the Hugging Face Trainer), each thin over
the DDP drop-in: :mod:`.frameworks`.
"""
