"""Text by tokens through both drop-ins: ``Balancer.for_world(seqs, B, lengths=..., cost=...)`` with
``bno.DataLoader`` and ``bno.DistributedOptimizer`` (Horovod, under mpirun) or
``bno.DistributedDataParallel`` (torch.distributed, under torchrun), 4 ranks whose split changes
every 2 updates with a rank at 1 sequence, against one process on the same global batches (gpt-mini,
float64, Adam, 12 updates; ``tests/support/mpi_scripts/text_dropin_cases.py`` runs the cases, one
job per drop-in).

Why it is exact: the loop's loss is the mean over this rank's tokens; each drop-in multiplies this
rank's gradients by its share of the global batch's tokens (``step.weight``) and sums over the
ranks, which gives the mean over every token of the global batch. Weighted by sequence counts
instead (``for_world`` without ``lengths=``, as for images) the same runs are off by orders of
magnitude more than rounding: the variant that fails without token weighting.
"""

import json

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import ROOT, TORCHRUN_EXIT_HANG, assert_ok, mpirun, python_cmd, torchrun

from bno_hvd.data.corpus import fortunes

pytestmark = pytest.mark.mpi

SCRIPT = f"{ROOT}/tests/support/mpi_scripts/text_dropin_cases.py"
CASES = ["counts", "cost", "unweighted"]
UPDATES, GLOBAL, TOKENS = 12, 16, 400


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Every 8th fortune, one JSON line each (as tests/training/test_text_training.py)."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "fortunes.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in fortunes()[::8]))
    return str(root)


def run_job(launcher, np_, out, corpus, cases):
    out.mkdir()
    if launcher == "torchrun":
        done = [out / f"done-{r}" for r in range(np_)]
        proc = torchrun(np_, [SCRIPT, corpus, str(out), "--dropin=ddp", *cases], timeout=400, done=done)
    else:
        proc = mpirun(np_, python_cmd(SCRIPT, corpus, str(out), *cases), timeout=400)
    assert_ok(proc)
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def one(corpus, tmp_path_factory):
    return run_job("mpirun", 1, tmp_path_factory.mktemp("text") / "one", corpus, ["counts", "cost"])


@pytest.fixture(scope="module")
def horovod(corpus, tmp_path_factory):
    return run_job("mpirun", 4, tmp_path_factory.mktemp("text") / "horovod", corpus, CASES)


@pytest.fixture(scope="module")
def ddp(corpus, tmp_path_factory):
    return run_job("torchrun", 4, tmp_path_factory.mktemp("text") / "ddp", corpus, CASES)


def result(out, case):
    return torch.load(out / case / "model.pt", weights_only=True), json.loads((out / case / "updates.json").read_text())


DROPINS = ["horovod", pytest.param("ddp", marks=TORCHRUN_EXIT_HANG)]


@pytest.mark.parametrize("dropin", DROPINS)
def test_text_through_the_drop_in_equals_one_process(dropin, request, one):
    job = request.getfixturevalue(dropin)
    ref_counts, ref_rows = result(one, "counts")
    ref_tokens, ref_token_rows = result(one, "cost")
    counts, rows = result(job, "counts")
    cost, cost_rows = result(job, "cost")
    # split by sequence counts: the splits given, a rank at 1 sequence, weights = shares of tokens
    sizes = [r["sizes"] for r in rows]
    assert len(sizes) == UPDATES and all(sum(s) == GLOBAL and 1 in s for s in sizes)
    assert len({tuple(s) for s in sizes}) == UPDATES // 2, sizes  # a new split every 2 updates
    for r, ref in zip(rows, ref_rows):
        assert r["weights"] == pytest.approx([t / sum(r["tokens"]) for t in r["tokens"]], rel=1e-12)
        assert sum(r["tokens"]) == ref["tokens"][0]  # the same global batch as one process
    assert any(abs(w - s / GLOBAL) > 0.05 for r in rows for w, s in zip(r["weights"], r["sizes"]))
    # split by measured cost: shares that change every 2 updates, the global batch fixed in tokens
    counts_by_cost = [r["sizes"] for r in cost_rows]
    assert len({tuple(s) for s in counts_by_cost}) >= 4 and min(min(s) for s in counts_by_cost) <= 2, counts_by_cost
    for r, ref in zip(cost_rows, ref_token_rows):
        assert sum(r["tokens"]) == ref["tokens"][0] >= TOKENS and sum(r["sizes"]) == ref["sizes"][0]
    by_counts, by_cost = max_relative_difference(counts, ref_counts), max_relative_difference(cost, ref_tokens)
    print(f"{dropin} drop-in, text: 4 ranks vs 1 process {by_counts:.2e} (split by counts), {by_cost:.2e} (by cost)")
    assert by_counts <= 1e-10 and by_cost <= 1e-10


@pytest.mark.parametrize("dropin", DROPINS)
def test_weighting_by_sequence_counts_instead_of_tokens_is_not_exact(dropin, request, one):
    """The same splits weighted as images are (n_r / sum(n)): the mean over each rank's tokens,
    averaged by sequence counts, is not the mean over the global batch's tokens."""
    reference, _ = result(one, "counts")
    unweighted, rows = result(request.getfixturevalue(dropin), "unweighted")
    assert all(r["weights"] == pytest.approx([s / GLOBAL for s in r["sizes"]]) for r in rows)
    diff = max_relative_difference(unweighted, reference)
    print(f"{dropin} drop-in, text weighted by sequence counts: 4 ranks vs 1 process {diff:.2e}")
    assert diff > 1e-6
