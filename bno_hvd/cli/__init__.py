"""THE COMMAND LINE: the ``bno-hvd`` commands, their flags, the console a job's output goes
through, hostfiles and the mpirun command line.

May import every wing (common, allocation, data, processes, library, training, lab): this is where a user's flags
become a :class:`~bno_hvd.training.config.TrainConfig` and a run, and where lab behaviour
(emulation, CPU quotas, faults) is plugged into a training run. Nothing imports the CLI.

- :mod:`.main` - the click group (``bno-hvd``), one error line per user error
- :mod:`.flags` - the flags train, bench and experiment share (:mod:`.textflags`: the text ones,
  :mod:`.modelflags`: ``--exact-batchnorm``)
- :mod:`.bench_text` - ``bench --dataset text``
- :mod:`.train`, :mod:`.bench`, :mod:`.experiment`, :mod:`.allocate`, :mod:`.docs` - the commands
- :mod:`.tta` - ``time-to-accuracy``: whole runs to a target accuracy, in rounds
- :mod:`.simulate` - ``simulate``: strategies on simulated profiles (:mod:`bno_hvd.lab.sim`)
- :mod:`.agent` - ``elastic``: a job whose ranks may leave and join (:mod:`bno_hvd.processes.elasticagent`)
- :mod:`.ledgercheck` - ``ledger check``: every sample used exactly once (:mod:`bno_hvd.training.ledger`)
- :mod:`.console` - what the user sees of a job (``bno-hvd console``)
- :mod:`.hostfile` - hostfile validation (``bno-hvd check-hostfile``)
- :mod:`.launching` - the mpirun command line and ``launch/mpi-env``'s exports
"""


def main(*args, **kwargs):
    """The ``bno-hvd`` entry point (:data:`bno_hvd.cli.main.main`)."""
    from bno_hvd.cli.main import main as group

    return group(*args, **kwargs)
