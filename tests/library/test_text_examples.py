"""The text examples: ``examples/text_loop.py`` (the Horovod drop-in) and ``examples/ddp_text.py``
(the DDP drop-in, a plain DDP script's port marked as ``examples/ddp_mnist.py``'s is), each split by
the cost measured on its model and weighted by tokens.

- They use only what ``bno_hvd`` exports (and the offline corpus of ``bno_hvd.data``).
- ``ddp_text.py``'s plain twin differs in the marked lines alone (at most 8, none in its loop) and
  keeps every lint rule, as does the example.
- Each, run unchanged in float64 (``tests/support/run_port.py``) on 2 (text_loop) or 4 (ddp_text,
  under torchrun; ``random`` re-splits every 2 updates) uneven ranks, trains to the parameters of one
  process on the same global batches (text_loop's are fixed in tokens; ddp_text's are 16 sequences).
"""

import ast
import difflib
import json
import re

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import ROOT, TORCHRUN_EXIT_HANG, assert_ok, mpirun, python_cmd, torchrun
from support.port_twin import example_source, lint_failures, plain_twin, port_markers

import bno_hvd
from bno_hvd.data.corpus import fortunes

TEXT_LOOP, DDP_TEXT = f"{ROOT}/examples/text_loop.py", f"{ROOT}/examples/ddp_text.py"


@pytest.mark.parametrize("path", [TEXT_LOOP, DDP_TEXT])
def test_the_examples_use_only_exported_names(path):
    froms = [n for n in ast.walk(ast.parse(example_source(path))) if isinstance(n, ast.ImportFrom)]
    ours = [(n.module, [a.name for a in n.names]) for n in froms if n.module.startswith("bno_hvd")]
    assert ours == [("bno_hvd.data", ["load_text_datasets"])]  # the offline corpus; the rest is `bno.`

    used = set(re.findall(r"\bbno\.(\w+)", example_source(path)))
    assert used and used <= set(bno_hvd.__all__), used - set(bno_hvd.__all__)


def test_the_ddp_text_twin_differs_from_the_example_in_the_marked_lines_alone():
    source = example_source(DDP_TEXT)
    marks = port_markers(source)
    example, twin = source.splitlines(), plain_twin(source).splitlines()
    assert 1 <= len(marks) <= 8, len(marks)
    compile("\n".join(twin), "twin", "exec")
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, twin, example, autojunk=False).get_opcodes():
        if tag != "equal":
            assert all(j in marks for j in range(j1, j2)), example[j1:j2]
            was = [marks[j] for j in range(j1, j2) if marks[j] is not None]
            assert [line.strip() for line in twin[i1:i2]] == was, (twin[i1:i2], was)
    assert "# bno-hvd" not in source[source.index("def train(") : source.index("def main(")]
    code = [line for line in twin if not line.lstrip().startswith("#")]
    assert not any(re.search(r"\bbno\.", line) for line in code)
    assert any("torch.nn.parallel.DistributedDataParallel(model" in line for line in twin)
    assert any("DistributedSampler(train_set" in line for line in twin)


@pytest.mark.slow
def test_the_ddp_text_twin_and_the_example_keep_every_lint_and_format_rule():
    failures = lint_failures(DDP_TEXT)
    assert not failures, failures


def run_example(launcher, np_, out, script, args=()):
    """``script`` through tests/support/run_port.py (float64; batch sizes and rank 0's model kept)."""
    out.mkdir()
    cmd = ["tests/support/run_port.py", str(out), script, *args]
    if launcher == "torchrun":
        proc = torchrun(np_, cmd, timeout=300, done=[out / f"done-{r}" for r in range(np_)])
    elif script == DDP_TEXT:  # torch.distributed's env:// from the MPI world
        proc = mpirun(np_, python_cmd("-m", "bno_hvd.processes.torchenv", *cmd), timeout=300)
    else:
        proc = mpirun(np_, python_cmd(*cmd), timeout=300)
    assert_ok(proc)
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    sizes = [json.loads((out / f"sizes-{r}.json").read_text()) for r in range(np_)]
    return proc, torch.load(out / "model.pt", weights_only=True), sizes


@pytest.mark.mpi
def test_the_horovod_text_example_on_2_ranks_equals_one_process(tmp_path):
    """As written (its global batches are 2048 tokens, split by the cost rank 0 measured, `balanced`)."""
    one_proc, one, _ = run_example("mpirun", 1, tmp_path / "one", TEXT_LOOP)
    two_proc, two, sizes = run_example("mpirun", 2, tmp_path / "two", TEXT_LOOP)
    per_update = list(zip(sizes[0][-len(sizes[1]) :], sizes[1]))  # rank 0's first passes measured the cost
    assert len(per_update) == 40 and all(min(s) >= 1 for s in per_update)
    line = re.search(r"sequences per rank \[(\d+), (\d+)\], (\d+) tokens, loss ([0-9.]+)", two_proc.stdout)
    assert line and int(line[3]) >= 2048 and float(line[4]) < 7.0, two_proc.stdout[-2000:]  # from ~7.6 (log 2048)
    diff = max_relative_difference(two, one)
    print(f"examples/text_loop.py: 2 ranks vs 1 process {diff:.2e}")
    assert diff <= 1e-10


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """Every 32nd fortune (about 1,000 sequences of at most 48 tokens: an epoch of ~60 updates)."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "fortunes.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in fortunes()[::32]))
    return str(root)


DDP_ARGS = ["--max-seq-len", "48", "--vocab-size", "512", "--strategy", "random", "--rebalance-every", "2"]


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_the_ddp_text_example_on_4_uneven_ranks_equals_one_process(tmp_path, small_corpus):
    args = [*DDP_ARGS, "--data-dir", small_corpus, "--log-interval", "20"]
    one_proc, one, one_sizes = run_example("mpirun", 1, tmp_path / "one", DDP_TEXT, [*args, "--batch-size", "16"])
    four_proc, four, sizes = run_example("torchrun", 4, tmp_path / "four", DDP_TEXT, [*args, "--batch-size", "4"])
    updates = len(sizes[1])
    per_update = list(zip(sizes[0][-updates:], *sizes[1:]))  # rank 0's first passes measured the cost
    assert updates >= 50 and one_sizes[0][-updates:] == [16] * updates
    assert all(sum(s) == 16 and min(s) >= 1 for s in per_update)
    assert sum(len(set(s)) > 1 for s in per_update) > updates * 0.8  # uneven in (nearly) every update
    assert sum(a != b for a, b in zip(per_update, per_update[1:])) >= updates // 3  # and the split moves
    diff = max_relative_difference(four, one)
    print(f"examples/ddp_text.py: 4 ranks vs 1 process {diff:.2e}")
    assert diff <= 1e-10
    ppl = r"test set: perplexity [0-9.]+ \(loss ([0-9.]+)"
    assert re.search(ppl, four_proc.stdout) and float(re.search(ppl, four_proc.stdout)[1]) < 6.2  # from ~6.2 (log 512)
