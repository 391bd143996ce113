"""Text, exactly: 4 ranks whose splits change (``random`` re-splits every 2 updates) train gpt-mini
to the same parameters as one process on the same global batches (float64), also with DataLoader
workers and with ranks that accumulate micro-batches under --max-tokens; and a run killed and
resumed ends where the uninterrupted one (the last of those 4-rank runs) does.

Why it is exact: each rank's loss is its mean over its tokens, weighted by its share of the global
batch's tokens; Horovod sums (op=Sum), so the gradient is the mean over every token of the global
batch, whatever the split (:mod:`bno_hvd.training.tasks`).

The text is every 8th of Debian's fortunes (1,903 documents, written as ``--data-dir``): the split
and the exactness do not depend on the corpus's size, and each rank of each job then encodes an
eighth of the built-in corpus's text (a second of start-up per rank spared)."""

import json

import pytest
import torch
from support import resume
from support.checks import max_relative_difference
from support.jobs import assert_ok, bno_cmd, mpirun

from bno_hvd.data.corpus import fortunes
from bno_hvd.lab.logread import read_updates
from bno_hvd.training.results import steps_from_json

pytestmark = pytest.mark.mpi

TEXT = ["train", "--dataset", "text", "--model", "gpt-mini", "--max-seq-len", "48", "--vocab-size", "512"]
EXACT = [*TEXT, "--dtype", "float64", "--optimizer", "adam", "--lr", "0.003", "--seed", "5", "--updates", "12"]
EXACT += ["--no-eval", "--no-progress", "--latency-interval", "0"]
GLOBAL = 24  # sequences per update


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """``--data-dir`` of every 8th fortune, one JSON line each (a fortune spans lines)."""
    root = tmp_path_factory.mktemp("corpus")
    docs = fortunes()[::8]
    (root / "fortunes.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return ["--data-dir", str(root)]


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
def single_process(tmp_path_factory, corpus):
    """One process on the whole global batch of every update (``GLOBAL`` sequences or ``TOKENS`` tokens)."""
    runs = {}

    def get(kind):
        if kind not in runs:
            runs[kind] = train(1, [*SINGLE[kind], *corpus], tmp_path_factory.mktemp(kind), "single")
        return runs[kind]

    return get


ACCUMULATE = ["--num-workers", "2", "--max-tokens", "96,96,200,48"]  # rank 3 (48 tokens a pass) accumulates
CASES = {  # id: (the one-process run it must equal, flags of the 4 ranks beside the changing split)
    "changing splits in tokens": ("tokens", ["--allocate-by", "tokens", "--global-tokens", str(TOKENS)]),
    "workers and accumulation": ("sequences", ["--allocate-by", "samples", *ACCUMULATE]),
    "shares of cost, global batch in tokens": (
        "tokens",
        ["--allocate-by", "cost", "--global-tokens", str(TOKENS), *ACCUMULATE],
    ),
    "torch engine": ("tokens", ["--engine", "torch", "--allocate-by", "tokens", "--global-tokens", str(TOKENS)]),
}
SPLIT = ["--strategy", "random", "--rebalance-every", "2", "--base-batch-size", str(GLOBAL // 4)]


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory, corpus):
    """The 4-rank run of a case of ``CASES``: (model, log directory), made once per module (the
    resume test below takes the first case's run as its uninterrupted reference)."""
    runs = {}

    def get(case):
        if case not in runs:
            root = tmp_path_factory.mktemp("multi")
            runs[case] = (train(4, [*SPLIT, *CASES[case][1], *corpus], root, "multi"), root / "multi.pt")
        return runs[case]

    return get


@pytest.mark.parametrize("case", list(CASES))
def test_four_ranks_with_changing_splits_equal_one_process(single_process, four_ranks, case):
    kind, extra = CASES[case]
    (multi, log), _ = four_ranks(case)
    single, single_log = single_process(kind)
    diff = max_relative_difference(multi, single)
    print(f"{case}: max relative difference {diff:.3e}")
    assert diff <= 1e-10  # float64; measured 6.2e-13, 5.0e-13, 7.6e-13
    records = read_updates(str(log))
    assert len({tuple(r.batch_sizes) for r in records}) >= 4  # the split really changed
    assert [r.global_tokens for r in records] == [r.global_tokens for r in read_updates(str(single_log))]
    losses = [r.loss for r in records]
    assert losses == pytest.approx([r.loss for r in read_updates(str(single_log))], rel=1e-10)
    assert losses[-1] < losses[0]  # it trained
    if "--max-tokens" in extra:
        steps = steps_from_json(json.loads((log / "ranks.json").read_text()))
        assert max(s.micro_batches for s in steps[3]) >= 2  # rank 3 (48 tokens per pass) accumulated


def test_killed_and_resumed_text_run_ends_with_the_same_parameters(four_ranks, corpus, tmp_path):
    # global batches in tokens (the data position depends on every earlier batch): checkpoints 4
    # and 8, killed at 10 (cost shares are not this case: they follow measured costs, whose splits
    # two runs need not share)
    case = "changing splits in tokens"
    (_, ref_log), ref_model = four_ranks(case)
    run = [*EXACT, *SPLIT, *CASES[case][1], *corpus]
    r = resume.kill_and_resume(tmp_path, run, kill_at=10, every=4, reference=(ref_model, ref_log))
    ref, resumed = torch.load(r.ref_model, weights_only=True), torch.load(r.model, weights_only=True)
    diff = max_relative_difference(resumed, ref, 1e-300)
    print(f"text resume: max relative difference {diff:.3e}")
    assert diff <= 1e-12
    assert json.loads((r.log_dir / "run.json").read_text())["resumed_from"] == 8
    ref_records, records = read_updates(str(r.ref_log)), read_updates(str(r.log_dir))
    assert [x.update for x in records] == list(range(12))
    assert [x.batch_sizes for x in records] == [x.batch_sizes for x in ref_records]
    assert [x.loss for x in records] == pytest.approx([x.loss for x in ref_records], rel=1e-12)
