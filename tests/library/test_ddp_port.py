"""The DDP port (``examples/ddp_mnist.py``, docs/ddp.md) and the torch engine's exactness.

- The example is a plain DDP script (in the shape of PyTorch's torchrun tutorial) with its port
  marked as the Horovod example's is (``tests/support/port_twin.py``): the twin differs in the
  marked lines alone, keeps every lint rule and trains under torchrun.
- The example, run unchanged on 4 ranks whose random, uneven split changes every 2 updates,
  trains exactly as one process does on the whole global batch (float64, its ``Net`` with two
  dropouts made exact by ``exact_dropout``): under torchrun (the control plane on a Gloo group)
  and under mpirun (``python -m bno_hvd.processes.torchenv``: the control plane on mpi4py).
"""

import difflib
import json
import re

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import FASHION_DIR, ROOT, TORCHRUN_EXIT_HANG, assert_ok, mpirun, python_cmd, torchrun
from support.port_twin import DDP_EXAMPLE, example_source, lint_failures, plain_twin, port_diff, port_markers
from support.run_port import write_fashion_subset

ARGS = ["--epochs", "2", "--strategy", "random", "--log-interval", "8", "--seed", "5"]


def run_ddp(launcher, np_, out, script, args):
    """``script`` on ``np_`` ranks through tests/support/run_port.py (float64; sizes and the final
    model kept), under torchrun or under mpirun (through bno_hvd.processes.torchenv)."""
    out.mkdir()
    cmd = ["tests/support/run_port.py", str(out), str(script), *args]
    if launcher == "torchrun":
        done = [out / f"done-{r}" for r in range(np_)]  # a hang at exit after them: TORCHRUN_EXIT_HANG
        proc = torchrun(np_, cmd, timeout=180, done=done)
    else:
        proc = mpirun(np_, python_cmd("-m", "bno_hvd.processes.torchenv", *cmd), timeout=600)
    assert_ok(proc)
    sizes = [json.loads((out / f"sizes-{r}.json").read_text()) for r in range(np_)]
    return proc, torch.load(out / "model.pt", weights_only=True), sizes


def test_the_ddp_twin_differs_from_the_example_in_the_marked_lines_alone():
    source = example_source(DDP_EXAMPLE)
    marks = port_markers(source)
    example, twin = source.splitlines(), plain_twin(source).splitlines()
    assert 1 <= len(marks) <= 8, len(marks)
    compile("\n".join(twin), "twin", "exec")
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, twin, example, autojunk=False).get_opcodes():
        if tag != "equal":
            assert all(j in marks for j in range(j1, j2)), example[j1:j2]  # an unmarked line differs
            was = [marks[j] for j in range(j1, j2) if marks[j] is not None]
            assert [line.strip() for line in twin[i1:i2]] == was, (twin[i1:i2], was)
    # nothing inside the training loop changes: every marked line is in main() or the options
    body = source[source.index("def train(") : source.index("def main(")]
    assert "# bno-hvd" not in body
    code = [line for line in twin if not line.lstrip().startswith("#")]
    assert not any(re.search(r"\bbno\.", line) for line in code)
    assert any("torch.nn.parallel.DistributedDataParallel(model" in line for line in twin)
    assert any("DistributedSampler(train_set" in line for line in twin)


def test_docs_show_the_port_as_it_is():
    with open(f"{ROOT}/docs/ddp.md") as fh:
        page = fh.read()
    assert port_diff(example_source(DDP_EXAMPLE), name="examples/ddp_mnist.py", plain="DDP") in page
    assert "torchrun --nproc-per-node 4 examples/ddp_mnist.py" in page


@pytest.mark.slow
def test_the_ddp_twin_and_the_example_keep_every_lint_and_format_rule():
    failures = lint_failures(DDP_EXAMPLE)
    assert not failures, failures


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_the_plain_ddp_twin_trains_under_torchrun(tmp_path, fashion_available):
    """The 'before' of the port is a working DDP script: DistributedSampler's even split (2 ranks
    show it as 4 do; the port's own runs below take 4)."""
    data = write_fashion_subset(tmp_path / "data", FASHION_DIR, train=256, test=128)
    twin = tmp_path / "plain_ddp_mnist.py"
    twin.write_text(plain_twin(example_source(DDP_EXAMPLE)))
    args = ["--epochs", "1", "--batch-size", "32", "--log-interval", "2", "--data-dir", data]
    proc, model, sizes = run_ddp("torchrun", 2, tmp_path / "out", twin, args)
    assert sizes == [[32] * 4] * 2  # 256 / 2 ranks / 32 = 4 steps of 32 samples on each rank
    assert all(f"rank {r}, epoch 1, step 2/4: 96/128 of this rank's samples" in proc.stdout for r in range(2))
    assert proc.stdout.count("test set: mean loss") == 1
    assert "bno-hvd" not in proc.stderr and "Traceback" not in proc.stderr
    assert all(torch.isfinite(t).all() for t in model.values())


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, fashion_available):
    """The reference: the example in one process on the whole global batch (16, lr 4 x 0.01), under
    mpirun (the launcher is not the point of a reference; torchrun's own process costs a torch import)."""
    where = tmp_path_factory.mktemp("ddp-one")
    data = write_fashion_subset(where / "data", FASHION_DIR, train=500, test=100)
    args = [*ARGS, "--data-dir", data, "--batch-size", "16", "--lr", "0.04", "--rebalance-every", "2"]
    return data, run_ddp("mpirun", 1, where / "one", DDP_EXAMPLE, args)


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", [pytest.param("torchrun", marks=TORCHRUN_EXIT_HANG), "mpirun"])
def test_the_ddp_port_on_4_uneven_ranks_equals_one_process(launcher, tmp_path, one_process):
    data, (single_proc, single, single_sizes) = one_process
    four = [*ARGS, "--data-dir", data, "--batch-size", "4", "--lr", "0.01", "--rebalance-every", "2"]
    multi_proc, multi, sizes = run_ddp(launcher, 4, tmp_path / "four", DDP_EXAMPLE, four)

    per_update = list(zip(*sizes))
    # one `for` = the global batches that start in the epoch: ceil(500/16) = 32, then 31
    assert len(per_update) == len(single_sizes[0]) == 32 + 31
    assert all(sum(s) == 16 for s in per_update) and set(single_sizes[0]) == {16}
    assert sum(len(set(s)) > 1 for s in per_update) > 50  # uneven in (nearly) every update
    changes = sum(a != b for a, b in zip(per_update, per_update[1:]))
    assert changes >= 25, changes  # a new split every 2 updates (the first ones are fixed by the lag)

    diff = max(float((multi[k] - single[k]).abs().max()) for k in single)
    print(f"{launcher}: 4 ranks vs 1 process: max parameter difference {diff:.2e}")
    assert diff <= 1e-10
    assert max_relative_difference(multi, single) <= 1e-9
    assert "Traceback" not in multi_proc.stderr + single_proc.stderr
    score = r"test set: mean loss [0-9.]+, accuracy [0-9.]+%"
    scores = re.findall(score, multi_proc.stdout)
    assert len(scores) == 2 and re.findall(score, single_proc.stdout)[-1] == scores[-1], scores
