"""The Horovod port (``examples/horovod_mnist.py``, docs/porting.md).

- The example is a plain Horovod script (written in the shape of Horovod's PyTorch MNIST example)
  with its port marked: every changed line ends in ``# bno-hvd: was <plain line>`` or
  ``# bno-hvd: added``. Undoing the markers gives the plain twin
  (``tests/support/port_twin.py``); the twin differs from the example in the marked lines alone,
  is ruff-clean, and trains under real Horovod (on 2 ranks: its even split shows there as on 4).
- The example, run unchanged on 4 ranks with a random, changing, uneven split, trains exactly as
  one process does on the whole global batch (float64; its ``Net`` with two dropouts, made exact
  by ``exact_dropout``).

The data are the first samples of the real Fashion-MNIST (so a run takes seconds; 500 is not a
multiple of the global batch 16: global batches cross the epochs' ends)."""

import difflib
import json
import re
import subprocess
import sys

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import FASHION_DIR, ROOT, assert_ok, horovodrun, mpirun, python_cmd
from support.port_twin import EXAMPLE, example_source, lint_failures, plain_twin, port_markers
from support.run_port import write_fashion_subset

ARGS = ["--epochs", "2", "--strategy", "random", "--log-interval", "8", "--seed", "5"]


def run_script(np_, out, script, args, launcher=horovodrun):
    """``script`` on ``np_`` ranks through tests/support/run_port.py (float64; sizes and the final
    model kept), under horovodrun as a user runs it (or ``launcher``: plain mpirun for a reference)."""
    out.mkdir()
    proc = launcher(np_, python_cmd("tests/support/run_port.py", str(out), str(script), *args), timeout=400)
    assert_ok(proc)
    sizes = [json.loads((out / f"sizes-{r}.json").read_text()) for r in range(np_)]
    return proc, torch.load(out / "model.pt", weights_only=True), sizes


def ruff(*args, source):
    return subprocess.run([sys.executable, "-m", "ruff", *args], input=source, capture_output=True, text=True, cwd=ROOT)


def test_the_twin_differs_from_the_example_in_the_marked_lines_alone():
    source = example_source()
    marks = port_markers(source)
    example, twin = source.splitlines(), plain_twin(source).splitlines()
    assert 1 <= len(marks) <= 8, len(marks)
    assert 1 <= sum("# offline" in line for line in example) <= 6
    compile("\n".join(twin), "twin", "exec")
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, twin, example, autojunk=False).get_opcodes():
        if tag != "equal":
            assert all(j in marks for j in range(j1, j2)), example[j1:j2]  # an unmarked line differs
            was = [marks[j] for j in range(j1, j2) if marks[j] is not None]
            assert [line.strip() for line in twin[i1:i2]] == was, (twin[i1:i2], was)
    for j, was in marks.items():  # a 'was' line is a change
        assert was != example[j].split("  # bno-hvd")[0].strip(), example[j]
    # the twin is plain Horovod: no bno-hvd call is left (its data path helper is the '# offline' import)
    code = [line for line in twin if not line.lstrip().startswith("#")]
    assert not any(re.search(r"\bbno\.", line) for line in code)
    assert "args.strategy" not in "\n".join(twin)


@pytest.mark.slow
def test_the_twin_and_the_example_keep_every_lint_and_format_rule():
    """The twin as it is; the example without its markers' texts (which run past 120 columns, the
    only rule ruff.toml waives for it)."""
    failures = lint_failures(EXAMPLE)
    assert not failures, failures


@pytest.mark.mpi
def test_the_plain_horovod_twin_trains(tmp_path, fashion_available):
    """The 'before' of the port is a working Horovod script: DistributedSampler's even split (2
    ranks show it as 4 do; the port's own run below takes 4)."""
    data = write_fashion_subset(tmp_path / "data", FASHION_DIR, train=256, test=128)
    twin = tmp_path / "plain_horovod_mnist.py"
    twin.write_text(plain_twin(example_source()))
    args = ["--epochs", "1", "--batch-size", "32", "--log-interval", "2", "--data-dir", data]
    proc, model, sizes = run_script(2, tmp_path / "out", twin, args)
    assert sizes == [[32] * 4] * 2  # 256 / 2 ranks / 32 = 4 steps of 32 samples on each rank
    assert all(f"rank {r}, epoch 1, step 2/4: 96/128 of this rank's samples" in proc.stdout for r in range(2))
    assert proc.stdout.count("test set: mean loss") == 1
    assert "bno-hvd" not in proc.stderr and "Traceback" not in proc.stderr
    assert all(torch.isfinite(t).all() for t in model.values())


@pytest.mark.mpi
def test_the_port_on_4_uneven_ranks_equals_one_process(tmp_path, fashion_available):
    data = write_fashion_subset(tmp_path / "data", FASHION_DIR, train=500, test=100)
    # the same global batch (4 x 4 = 16) and learning rate (the example scales lr by hvd.size())
    four = [*ARGS, "--data-dir", data, "--batch-size", "4", "--lr", "0.01"]
    one = [*ARGS, "--data-dir", data, "--batch-size", "16", "--lr", "0.04"]
    multi_proc, multi, sizes = run_script(4, tmp_path / "four", EXAMPLE, four)
    single_proc, single, single_sizes = run_script(1, tmp_path / "one", EXAMPLE, one, launcher=mpirun)

    per_update = list(zip(*sizes))
    # one `for` = the global batches that start in the epoch: ceil(500/16) = 32, the last crossing
    # 12 samples into the next epoch, which then has ceil(488/16) = 31
    assert len(per_update) == len(single_sizes[0]) == 32 + 31
    assert all(sum(s) == 16 for s in per_update) and set(single_sizes[0]) == {16}
    assert sum(len(set(s)) > 1 for s in per_update) > 50  # uneven in (nearly) every update
    assert len(set(per_update)) >= 6  # and rebalanced every 10 updates

    diff = max_relative_difference(multi, single)
    print(f"4 ranks vs 1 process: max relative parameter difference {diff:.2e}")
    assert diff <= 1e-12
    assert "Traceback" not in multi_proc.stderr + single_proc.stderr
    score = r"test set: mean loss [0-9.]+, accuracy [0-9.]+%"  # (mpirun's rank tags can follow it)
    scores = re.findall(score, multi_proc.stdout)
    assert len(scores) == 2 and re.findall(score, single_proc.stdout)[-1] == scores[-1], scores
    # the progress line's len(train_loader) (32, then 31 batches) and len(train_sampler) of the port
    assert "rank 3, epoch 2, step 8/31: " in multi_proc.stdout and "epoch 2, step 8/31: " in single_proc.stdout
