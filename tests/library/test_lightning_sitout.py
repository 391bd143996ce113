"""Ranks that sit out inside Lightning's loop (``bno.lightning.BalancedStrategy``, docs/lightning.md).

``tests/support/mpi_scripts/lightning_sitout.py`` trains the Lightning example's CNN (BatchNorm, two
dropouts) in float64 under torchrun on 4 ranks whose split changes every 2 updates, with ranks at 0
samples (one out and back, three of four out at once, rank 3 out for a whole epoch) and a rank at
1 sample, and on 1 process on the same global batches:

- every rank runs every update of Lightning's loop (the same ``global_step``), computes only those
  it has samples for, and holds rank 0's state bit for bit (parameters, BatchNorm's statistics,
  the optimizer's momentum) before each update it computes, at every validation (every 5 updates)
  and at the end: without the catch-up a rank back computes from a state it left with;
- the parameters and BatchNorm's running statistics equal one process's within 1e-10, and so does
  a loss logged with ``sync_dist=True`` on epoch (the epoch rank 3 sat out whole included);
- a checkpoint written while rank 3 sits out holds the current state: resumed from it, the run
  still equals one process;
- ``examples/lightning_mnist.py --strategy fixed:8,8,0,0`` (a split given by hand, ranks out from
  the first update) is accepted and trains as one process does.
"""

import csv
import json
import os

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import FASHION_DIR, ROOT, TORCHRUN_EXIT_HANG, assert_ok, torchrun
from support.run_port import write_fashion_subset

pytestmark = [pytest.mark.mpi, TORCHRUN_EXIT_HANG]

SCRIPT = "tests/support/mpi_scripts/lightning_sitout.py"
EXAMPLE = os.path.join(ROOT, "examples", "lightning_mnist.py")
CHECKPOINT_AT = 20  # rank 3 is out there


def run(np_, out, data, *args, script=SCRIPT):
    out.mkdir()
    cmd = [script, str(out), data, "--devices", str(np_), *args]
    proc = torchrun(np_, cmd, timeout=400, done=[out / f"done-{r}" for r in range(np_)])
    assert_ok(proc)
    assert "Traceback" not in proc.stderr
    return proc


def result(out, np_):
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(np_)]
    [metrics] = list(out.glob("logs/lightning_logs/version_*/metrics.csv"))
    epochs = [float(r["synced_loss_epoch"]) for r in csv.DictReader(metrics.open()) if r["synced_loss_epoch"]]
    return ranks, torch.load(out / "model.pt", weights_only=True), epochs


@pytest.fixture(scope="module")
def data(tmp_path_factory, fashion_available):
    return write_fashion_subset(tmp_path_factory.mktemp("lightning-sitout-data"), FASHION_DIR, train=200, test=64)


@pytest.fixture(scope="module")
def one(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("lightning-sitout") / "one"
    run(1, out, data)
    return result(out, 1)


@pytest.fixture(scope="module")
def four(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("lightning-sitout") / "four"
    run(4, out, data, "--checkpoint-at", str(CHECKPOINT_AT))
    return out, result(out, 4)


def splits(ranks):
    """Every update's split, as the ranks computed it (0 where a rank sat out)."""
    steps = ranks[0]["global_step"]
    sizes = [[0] * len(ranks) for _ in range(steps)]
    for r, rank in enumerate(ranks):
        for step, size, _ in rank["computed"]:
            sizes[step][r] = size
    return sizes


def test_ranks_out_keep_lightnings_loop_and_come_back_with_rank_0s_state(four):
    _, (ranks, _, _) = four
    sizes = splits(ranks)
    assert len(sizes) == 38 and all(sum(s) == 16 for s in sizes), sizes  # 3 epochs of 13, 12, 13 global batches
    assert all(rank["global_step"] == 38 for rank in ranks)  # every rank ran every update of the loop
    assert any(s.count(0) == 3 for s in sizes) and any(1 in s for s in sizes)
    assert all(s[3] == 0 for s in sizes[13:25])  # rank 3 out for the whole second epoch (updates 13..24)
    assert any(s[3] > 0 for s in sizes[25:])  # ... and back
    computed = {step: h for step, _, h in ranks[0]["computed"]}
    validated = dict(ranks[0]["validated"])
    assert len(validated) == 6
    for r, rank in enumerate(ranks):
        assert all(h == computed[step] for step, _, h in rank["computed"]), r  # rank 0's state before each update
        assert dict(rank["validated"]) == validated, r  # every rank validates rank 0's model
        assert rank["final"] == ranks[0]["final"], r


def test_ranks_out_inside_lightning_equal_one_process(four, one):
    _, (_, multi, epochs) = four
    _, single, single_epochs = one
    assert any("running_mean" in k for k in single)
    rel = max_relative_difference(multi, single)
    print(f"lightning sit-out: 4 ranks vs 1 process: max relative difference {rel:.2e}")
    assert rel <= 1e-10
    # the loss logged with sync_dist=True on epoch: the mean over every sample the ranks computed
    assert len(epochs) == len(single_epochs) == 3
    assert all(abs(a - b) <= 1e-10 * abs(b) for a, b in zip(epochs, single_epochs)), (epochs, single_epochs)


def test_a_checkpoint_written_while_a_rank_sits_out_resumes_exactly(four, tmp_path, data):
    """Resumed at update 20 (rank 3 out) up to update 23, within the epoch: a resumed run that crosses
    an epoch's end trains one update fewer, with or without sit-out (not fixed yet, docs/lightning.md)."""
    where, (ranks, _, _) = four
    [checkpoint] = list((where / "ckpt").glob(f"*step={CHECKPOINT_AT}.ckpt"))
    assert splits(ranks)[CHECKPOINT_AT - 1][3] == 0 and splits(ranks)[CHECKPOINT_AT][3] == 0
    run(4, tmp_path / "resumed", data, "--resume", str(checkpoint), "--max-steps", "23")
    run(1, tmp_path / "one", data, "--max-steps", "23")
    resumed_ranks, resumed, _ = result(tmp_path / "resumed", 4)
    _, single, _ = result(tmp_path / "one", 1)
    assert splits(resumed_ranks)[CHECKPOINT_AT:] == splits(ranks)[CHECKPOINT_AT:23]  # rank 3 still out
    assert all(rank["final"] == resumed_ranks[0]["final"] for rank in resumed_ranks)
    rel = max_relative_difference(resumed, single)
    print(f"lightning sit-out: resumed at update {CHECKPOINT_AT} vs 1 process: max relative difference {rel:.2e}")
    assert rel <= 1e-10


def test_a_split_given_by_hand_with_ranks_out_from_the_start_is_exact(tmp_path, data):
    common = ["--data-dir", data, "--epochs", "1", "--max-steps", "12", "--seed", "5"]
    outs = {}
    for np_, args in ((4, ["--batch-size", "4", "--strategy", "fixed:8,8,0,0"]), (1, ["--batch-size", "16"])):
        out = tmp_path / f"ranks-{np_}"
        out.mkdir()
        cmd = ["tests/support/run_port.py", str(out), EXAMPLE, "--devices", str(np_), "--log-dir", str(out / "logs")]
        proc = torchrun(np_, [*cmd, *common, *args], timeout=300, done=[out / f"done-{r}" for r in range(np_)])
        assert_ok(proc)
        outs[np_] = out
    sizes = [json.loads((outs[4] / f"sizes-{r}.json").read_text()) for r in range(4)]
    assert sizes == [[8] * 12, [8] * 12, [], []]  # ranks 2 and 3 never ran a forward
    rel = max_relative_difference(
        torch.load(outs[4] / "model.pt", weights_only=True), torch.load(outs[1] / "model.pt", weights_only=True)
    )
    print(f"lightning fixed:8,8,0,0 vs 1 process: max relative difference {rel:.2e}")
    assert rel <= 1e-10
