"""Dropout through ``bno-hvd train`` on both engines, under memory caps (the exactness matrix's
cells of the training command that no other test covers: ``tests/support/exactness_matrix.py``).

A user's model with a channel dropout and a plain one (``tests.support.user_model:small_dropout``),
4 ranks whose random split of each 32-sample global batch changes every 2 updates, with memory
caps 4,4,16,5 (a rank above its cap runs its batch in several passes; each pass draws the masks of
its own rows), Adam in float64, against one process on the same global batches: equal within
1e-10. Without per-sample masks each rank would draw from its own generator and no split would
equal one process.
"""

import json

import pytest
from support.checks import max_relative_difference
from support.jobs import assert_ok, bno_cmd, mpirun, run_cli
from support.train_runs import saved_model, train_args

from bno_hvd.training.results import steps_from_json

pytestmark = pytest.mark.mpi

MODEL = ["--model", "tests.support.user_model:small_dropout"]
UPDATES = 8


@pytest.mark.parametrize("engine", ["horovod", "torch"])
def test_dropout_under_memory_caps_equals_one_process(engine, tmp_path, fashion_dir):
    flags = [*MODEL, "--data-dir", fashion_dir]
    four = train_args(tmp_path / "four.pt", tmp_path / "four", *flags, "--engine", engine, "--strategy", "random",
                      "--global-batch", "32", "--rebalance-every", "2", "--max-batch", "4,4,16,5",
                      updates=UPDATES, optimizer="adam")  # fmt: skip
    assert_ok(mpirun(4, bno_cmd(*four), timeout=400))
    one = train_args(tmp_path / "one.pt", tmp_path / "one", *flags, "--strategy", "fixed", "--batch-sizes", "32",
                     updates=UPDATES, optimizer="adam")  # fmt: skip
    assert_ok(run_cli(*one, timeout=400))
    steps = steps_from_json(json.loads((tmp_path / "four" / "ranks.json").read_text()))
    splits = [tuple(rank[u].batch for rank in steps) for u in range(UPDATES)]
    assert all(sum(s) == 32 for s in splits) and len(set(splits)) >= 3, splits  # uneven, changing
    assert max(rank[u].micro_batches for rank in steps for u in range(UPDATES)) >= 3  # passes under the caps
    diff = max_relative_difference(saved_model(tmp_path / "four.pt"), saved_model(tmp_path / "one.pt"))
    print(f"{engine}: dropout under memory caps, 4 ranks vs 1 process {diff:.2e}")
    assert diff <= 1e-10
