"""A rank that sits out in a user's own loop, through either drop-in (``bno_hvd.library.sitout``):
``tests/support/mpi_scripts/dropin_sitout_cases.py`` trains a plain loop (``for images, labels in
loader: ... optimizer.step()``, nothing in it about sitting out) on 4 ranks whose split gives
ranks 0 samples, and on 1 process on the same global batches.

- a rank given 0 samples never sees those updates (no forward), and before each update it computes
  again its whole state (parameters, BatchNorm's running statistics, a GradScaler's scale) is rank
  0's, bit for bit: the drop-in sent it (without the catch-up it would be the state it left with);
- after the epoch's ``for`` (where a script evaluates) every rank holds rank 0's state; also where
  the loop leaves its ``for`` by a ``break`` while a rank is out (rank 0's word ends that rank's);
- the result equals one process within 1e-10 (float64): one rank out and back, up to three of four
  out at once, and a split 8,8,0,0 given by hand from the first update (Horovod); a model with
  exact BatchNorm (a rank at 1 sample) and one with two exact dropouts;
- DDP refuses, in one line on every rank, a split with zeros in its first two updates (torch's DDP
  rebuilds its gradient buckets over every rank at its second update).
"""

import json

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import FASHION_DIR, assert_ok, mpirun, python_cmd
from support.run_port import write_fashion_subset

pytestmark = pytest.mark.mpi

SCRIPT = "tests/support/mpi_scripts/dropin_sitout_cases.py"
CASES = {
    "horovod": ["sitout:mlp", "multisit:net", "hand:mlp", "sitout:net:5", "multisit:amp"],
    "ddp": ["sitout:net", "multisit:mlp", "multisit:mlp:9", "sitout:amp"],
}


@pytest.fixture(scope="module")
def data(tmp_path_factory, fashion_available):
    return write_fashion_subset(tmp_path_factory.mktemp("fashion"), FASHION_DIR, train=200, test=10)


def job(np_, dropin, data, out, cases):
    return mpirun(np_, python_cmd(SCRIPT, dropin, data, str(out), *cases), timeout=600)


@pytest.fixture(scope="module")
def one(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("sitout") / "one"
    proc = job(1, "horovod", data, out, sorted({c for cases in CASES.values() for c in cases}))
    assert_ok(proc)
    return out


@pytest.fixture(scope="module", params=sorted(CASES))
def four(request, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("sitout") / request.param
    proc = job(4, request.param, data, out, CASES[request.param])
    assert_ok(proc)
    assert "Traceback" not in proc.stderr
    return request.param, out


def test_a_rank_out_skips_its_updates_and_comes_back_with_rank_0s_state(four, one):
    dropin, out = four
    for case in CASES[dropin]:
        name = case.replace(":", "-")
        ranks = json.loads((out / f"{dropin}-{name}" / "ranks.json").read_text())
        sizes = {u: s for u, s, _ in ranks[0]["seen"]}
        assert sorted(sizes) == list(range(len(sizes))) and all(sum(s) == 16 for s in sizes.values())
        if case.count(":") == 2:  # the loop's break at update N, while a rank was out: every rank left its for
            assert len(sizes) == int(case.split(":")[2]) and 0 in sizes[len(sizes) - 1], sizes
        outs = {r for s in sizes.values() for r, b in enumerate(s) if b == 0}
        assert outs and 0 not in outs, sizes
        state = {u: h for u, _, h in ranks[0]["seen"]}
        for r, rank in enumerate(ranks):
            computed = [u for u, _, _ in rank["seen"]]
            assert computed == [u for u, s in sizes.items() if s[r] > 0], (case, r, computed)  # never an empty batch
            assert all(h == state[u] for u, _, h in rank["seen"]), (case, r)  # rank 0's state, bit for bit
            assert rank["final"] == ranks[0]["final"], (case, r)  # caught up at the end of the epoch
        if case.startswith("multisit"):
            assert max(sum(b == 0 for b in s) for s in sizes.values()) == 3  # three of four out at once
        if case.startswith("hand"):
            assert set(map(tuple, sizes.values())) == {(8, 8, 0, 0)}


def test_sitting_out_in_a_plain_loop_equals_one_process(four, one):
    dropin, out = four
    for case in CASES[dropin]:
        name = case.replace(":", "-")
        many = torch.load(out / f"{dropin}-{name}" / "model.pt", weights_only=True)
        single = torch.load(one / f"horovod-{name}" / "model.pt", weights_only=True)
        diff = max_relative_difference(many, single)
        print(f"{dropin} {case}: 4 ranks with ranks out vs 1 process {diff:.2e}")
        assert diff <= 1e-10, (dropin, case, diff)


def test_ddp_refuses_a_rank_out_before_its_buckets_are_rebuilt(data, tmp_path):
    proc = job(4, "ddp", data, tmp_path / "out", ["hand:mlp"])
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "bno-hvd: error:" in line]
    assert lines and all("0 samples in the first two updates" in line for line in lines), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
