"""A simulator of the update for allocation policies (pure Python/NumPy: no MPI, no clock).

It imports only :mod:`bno_hvd.allocation` and :mod:`bno_hvd.common` (never the runtime): a
strategy runs on it exactly as it is, fed the ClusterMetrics a real job gathers. The user's page
is ``docs/simulator.md``.

- :mod:`.cfs` - CPU time under a CFS limit, with its period's quantisation
- :mod:`.machine` - the calibrated machine and one profile of ranks
- :mod:`.engine` - the update: compute, arrival, wait, allreduce; the metrics a strategy gets
- :mod:`.calibration` - fitting the machine from the REAL suite's logs
- :mod:`.realsuite` - the REAL suite's profiles, and the validation table
- :mod:`.families` - random profiles: ``bno-hvd simulate``
- :mod:`.misses` - why ``balanced`` is below the best peer on a profile: its split, or its run
"""
