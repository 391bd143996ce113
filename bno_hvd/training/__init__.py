"""THE ``bno-hvd train`` APPLICATION: a whole training run built from one config. May import
:mod:`bno_hvd.common`, :mod:`bno_hvd.allocation`, :mod:`bno_hvd.data`, :mod:`bno_hvd.library`
and :mod:`bno_hvd.processes`; never the lab or the CLI (lab behaviour enters a run through a
:class:`~bno_hvd.training.hooks.Plugin`).

- :mod:`.config` - one frozen dataclass, validated by a table (:mod:`.textrules`: the text fields' checks,
  :mod:`.elasticrules`: ``--elastic``'s)
- :mod:`.components` - builds a run from its config
- :mod:`.loop` - the update loop (with :mod:`.stopwatch`, training seconds that pause for evaluation)
- :mod:`.hooks` - the hooks a plugin adds to a run
- :mod:`.tasks` - images or text: batches, loss, score; :mod:`.evaluation` - the test score
- :mod:`.calibrate` - the cost of a sequence, measured at start-up
- :mod:`.checkpoint` - model, optimizer, balancer and RNG state, written atomically
- :mod:`.elastic` - ``--elastic``: generations of ranks, the state carried from one to the next
- :mod:`.elasticscript` - ``bno.elastic`` (``State``, ``@run``): the same for the DDP drop-in in a user's script
- :mod:`.ledger` - the stream ranges every committed update used, and their check
- what a run writes: :mod:`.results` (what it measured), :mod:`.runlog` (rank 0's files and progress),
  :mod:`.stragglers`, :mod:`.tensorboard`
"""
