"""Horovod's MNIST example ported to bno-hvd (``examples/horovod_mnist.py``, README "Your own
Horovod script"): run unchanged on 4 ranks with a random, changing, uneven split, it trains
exactly as one process does on the whole global batch (float64; Horovod's Net with its two
dropouts, made exact by ``exact_dropout``).

The data are the first 4000/1000 samples of the real Fashion-MNIST (so a run takes seconds, and
4000 is not a multiple of the global batch 128: global batches cross the epochs' ends)."""

import json

import torch
from support.checks import max_relative_difference
from support.jobs import FASHION_DIR, assert_ok, horovodrun, python_cmd
from support.run_port import write_fashion_subset

ARGS = ["--epochs", "2", "--strategy", "random", "--log-interval", "8", "--seed", "5"]


def run_port(np_, out, data, batch_size, lr):
    out.mkdir()
    args = [*ARGS, "--data-dir", data, "--batch-size", str(batch_size), "--lr", str(lr)]
    proc = horovodrun(np_, python_cmd("tests/support/run_port.py", str(out), *args), timeout=400)
    assert_ok(proc)
    sizes = [json.loads((out / f"sizes-{r}.json").read_text()) for r in range(np_)]
    return proc, torch.load(out / "model.pt", weights_only=True), sizes


def test_the_port_on_4_uneven_ranks_equals_one_process(tmp_path, fashion_available):
    data = write_fashion_subset(tmp_path / "data", FASHION_DIR, train=4000, test=1000)
    # the same global batch (4 x 32 = 128) and learning rate (the example scales lr by hvd.size())
    multi_proc, multi, sizes = run_port(4, tmp_path / "four", data, 32, 0.01)
    single_proc, single, single_sizes = run_port(1, tmp_path / "one", data, 128, 0.04)

    per_update = list(zip(*sizes))
    # one `for` = the global batches that start in the epoch: ceil(4000/128) = 32, the last crossing
    # 96 samples into the next epoch, which then has ceil(3904/128) = 31
    assert len(per_update) == len(single_sizes[0]) == 32 + 31
    assert all(sum(s) == 128 for s in per_update) and set(single_sizes[0]) == {128}
    assert sum(len(set(s)) > 1 for s in per_update) > 50  # uneven in (nearly) every update
    assert len(set(per_update)) >= 6  # and rebalanced every 10 updates

    diff = max_relative_difference(multi, single)
    print(f"4 ranks vs 1 process: max relative parameter difference {diff:.2e}")
    assert diff <= 1e-12
    assert "Traceback" not in multi_proc.stderr + single_proc.stderr
    accuracy = [line for line in multi_proc.stdout.splitlines() if "Accuracy" in line]
    assert len(accuracy) == 2 and accuracy[-1].split("Accuracy")[1] in single_proc.stdout, accuracy
    # Horovod's own progress line, with len(train_sampler) and len(train_loader) of the port
    assert "Train Epoch: 2 [" in multi_proc.stdout and "(25%)]" in multi_proc.stdout
