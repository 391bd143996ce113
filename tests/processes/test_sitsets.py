"""Sets of the ranks that compute, made when an update first needs them
(:mod:`bno_hvd.processes.sitsets`), and what the loop makes of that time
(:meth:`bno_hvd.library.catchup.CatchUp.begin`). The sets' own calls are plain functions here:
the real Horovod and torch.distributed sets are made in ``tests/library/test_sit_out.py``."""

from types import SimpleNamespace

from bno_hvd.library.catchup import CatchUp
from bno_hvd.processes.sitsets import SitOutSets


def test_a_new_set_of_ranks_out_is_reported_so_its_time_is_not_the_steps():
    made, removed = [], []
    sets = SitOutSets(4, "all", lambda ranks: made.append(ranks) or tuple(ranks), removed.append, live=1)
    world = SimpleNamespace(sit_out_sets=sets, control_comm=None, rank=1)
    optimizer = SimpleNamespace(process_set=None)
    catch_up = CatchUp(world, None, optimizer)
    assert not catch_up.begin([8, 8, 8, 8]) and optimizer.process_set == "all" and sets.makes == 0
    # two ranks out: their set is made now (Horovod initialised again: 0.1 s, 36 s at 0.03 of a
    # core), which the loop logs apart from the step's gap; until 2026-11-27 it was in the gap
    assert catch_up.begin([16, 16, 0, 0]) and optimizer.process_set == (0, 1) and made == [[0, 1]]
    assert not catch_up.begin([16, 16, 0, 0]) and sets.makes == 1  # made before: nothing to log
    assert catch_up.begin([24, 0, 0, 8]) and made[-1] == [0, 3] and removed == [(0, 1)]  # one kept (live=1)
