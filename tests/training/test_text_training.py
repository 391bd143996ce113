"""Text, exactly: 4 ranks whose splits change (``random`` re-splits every 2 updates) train gpt-mini
to the same parameters as one process on the same global batches (float64), also with DataLoader
workers and with ranks that accumulate micro-batches under --max-tokens; and a run killed and
resumed ends where the uninterrupted one does.

Why it is exact: each rank's loss is its mean over its tokens, weighted by its share of the global
batch's tokens; Horovod sums (op=Sum), so the gradient is the mean over every token of the global
batch, whatever the split (:mod:`bno_hvd.training.tasks`)."""

import json

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import assert_ok, bno_cmd, mpirun
from support.resume import EXACT_40

from bno_hvd.lab.logread import read_updates
from bno_hvd.training.results import steps_from_json

pytestmark = pytest.mark.mpi

TEXT = ["train", "--dataset", "text", "--model", "gpt-mini", "--max-seq-len", "48", "--vocab-size", "512"]
EXACT = [*TEXT, "--dtype", "float64", "--optimizer", "adam", "--lr", "0.003", "--seed", "5", "--updates", "12"]
EXACT += ["--no-eval", "--no-progress", "--latency-interval", "0"]
GLOBAL = 24  # sequences per update


def train(np_, flags, tmp_path, name):
    model, log = tmp_path / f"{name}.pt", tmp_path / f"{name}-log"
    proc = mpirun(np_, bno_cmd(*EXACT, *flags, "--save-model", str(model), "--log-dir", str(log)), timeout=400)
    assert_ok(proc)
    return torch.load(model, weights_only=True), log


TOKENS = 700  # tokens per update, when the global batch is fixed in tokens
SINGLE = {
    "sequences": ["--strategy", "fixed", "--batch-sizes", str(GLOBAL)],
    "tokens": ["--strategy", "equal", "--allocate-by", "tokens", "--global-tokens", str(TOKENS)],
}


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    """One process on the whole global batch of every update (``GLOBAL`` sequences or ``TOKENS`` tokens)."""
    runs = {}

    def get(kind):
        if kind not in runs:
            runs[kind] = train(1, SINGLE[kind], tmp_path_factory.mktemp(kind), "single")
        return runs[kind]

    return get


@pytest.mark.parametrize(
    "kind,extra",
    [
        ("sequences", ["--allocate-by", "samples"]),
        ("sequences", ["--allocate-by", "samples", "--num-workers", "2", "--max-tokens", "96,96,200,48"]),
        (
            "tokens",
            [
                "--allocate-by",
                "cost",
                "--global-tokens",
                str(TOKENS),
                "--num-workers",
                "2",
                "--max-tokens",
                "96,96,200,48",
            ],
        ),
    ],
    ids=["changing splits", "workers and accumulation", "shares of cost, global batch in tokens"],
)
def test_four_ranks_with_changing_splits_equal_one_process(single_process, tmp_path, kind, extra):
    flags = ["--strategy", "random", "--rebalance-every", "2", "--base-batch-size", str(GLOBAL // 4), *extra]
    multi, log = train(4, flags, tmp_path, "multi")
    single, single_log = single_process(kind)
    diff = max_relative_difference(multi, single)
    print(f"{extra or 'plain'}: max relative difference {diff:.3e}")
    assert diff <= 1e-10  # float64; measured 2.0e-12, 4.7e-13, 8.0e-13
    records = read_updates(str(log))
    assert len({tuple(r.batch_sizes) for r in records}) >= 4  # the split really changed
    assert [r.global_tokens for r in records] == [r.global_tokens for r in read_updates(str(single_log))]
    losses = [r.loss for r in records]
    assert losses == pytest.approx([r.loss for r in read_updates(str(single_log))], rel=1e-10)
    assert losses[-1] < losses[0]  # it trained
    if "--max-tokens" in extra:
        steps = steps_from_json(json.loads((log / "ranks.json").read_text()))
        assert max(s.micro_batches for s in steps[3]) >= 2  # rank 3 (48 tokens per pass) accumulated


def test_killed_and_resumed_text_run_ends_with_the_same_parameters(kill_and_resume):
    run = [*TEXT, *EXACT_40, "--optimizer", "adam", "--lr", "0.003", "--strategy", "random", "--allocate-by"]
    run += ["tokens", "--global-tokens", "300", "--rebalance-every", "3", "--num-workers", "1", "--max-tokens", "64"]
    r = kill_and_resume([*run, "--updates", "20"], kill_at=13, every=5)  # checkpoint 10, killed at 13
    ref, resumed = torch.load(r.ref_model, weights_only=True), torch.load(r.model, weights_only=True)
    diff = max_relative_difference(resumed, ref, 1e-300)
    print(f"text resume: max relative difference {diff:.3e}")
    assert diff <= 1e-12
    ref_records, records = read_updates(str(r.ref_log)), read_updates(str(r.log_dir))
    assert [x.update for x in records] == list(range(20))
    assert [x.batch_sizes for x in records] == [x.batch_sizes for x in ref_records]
    assert [x.loss for x in records] == pytest.approx([x.loss for x in ref_records], rel=1e-12)
