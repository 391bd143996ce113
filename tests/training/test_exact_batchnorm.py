"""Exact BatchNorm (:mod:`bno_hvd.library.batchnorm`) through ``bno-hvd train``: torchvision's
``resnet18`` (20 BatchNorm2d layers) on 4 ranks whose split changes after every update and has a
rank at 1 sample in every update (2 updates of 8 samples: the split changes once) trains exactly as
one process on the same global batches, whose BatchNorm is torch's own (``--local-batchnorm`` in a
process of its own is plain BatchNorm): parameters and running statistics within 1e-10 (float64).
The same 4-rank run with ``--local-batchnorm`` is far off: the comparison can fail.

Two updates are enough: the second starts from parameters, momentum and running statistics the
first left, under another split (a job's start-up and resnet18's allreduce cost more than a
third update would add)."""

import json

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import assert_ok, bno_cmd, mpirun, run_cli

pytestmark = pytest.mark.mpi

COMMON = ("--model", "resnet18", "--dtype", "float64", "--updates", "2", "--lr", "0.02", "--momentum", "0.9")
COMMON += ("--seed", "3", "--no-eval", "--no-progress", "--latency-interval", "0")


def train(np_, tmp_path, name, *flags):
    path = tmp_path / f"{name}.pt"
    args = ["train", *COMMON, "--save-model", str(path), "--log-dir", str(tmp_path / name), *flags]
    # the reference is a plain process (a world of one rank): no launcher to start
    proc = mpirun(np_, bno_cmd(*args), timeout=600) if np_ > 1 else run_cli(*args, timeout=600)
    assert_ok(proc)
    records = [json.loads(line) for line in open(tmp_path / name / "updates.jsonl")]
    return torch.load(path, weights_only=True), [r["batch_sizes"] for r in records if "batch_sizes" in r], proc


def test_resnet18_on_4_changing_uneven_ranks_equals_one_process(tmp_path, fashion_dir):
    data = ("--data-dir", fashion_dir)
    split = (*data, "--strategy", "random", "--rebalance-every", "1", "--base-batch-size", "2")
    exact, sizes, proc = train(4, tmp_path, "exact", *split)
    single, _, _ = train(1, tmp_path, "single", *data, "--strategy", "fixed", "--batch-sizes", "8", "--local-batchnorm")
    local, local_sizes, local_proc = train(4, tmp_path, "local", *split, "--local-batchnorm")

    assert len(sizes) == 2 and all(sum(s) == 8 for s in sizes) and sizes == local_sizes
    assert all(1 in s for s in sizes), sizes  # a rank at 1 sample in every update
    assert sizes[0] != sizes[1], sizes  # the split changed
    keys = [k for k in single if "running_" in k]
    assert len(keys) == 40 and exact.keys() == single.keys()  # 20 layers' running mean and variance
    diff = max_relative_difference(exact, single)
    stats = max_relative_difference({k: exact[k] for k in keys}, {k: single[k] for k in keys})
    far = max_relative_difference(local, single)
    print(
        f"resnet18, 4 ranks vs 1 process: exact BatchNorm {diff:.2e} (running statistics {stats:.2e}), "
        f"local BatchNorm {far:.2e}"
    )
    assert diff <= 1e-10 and stats <= 1e-10
    assert far > 1e-3
    assert "BatchNorm" in local_proc.stderr and "bno-hvd: note:" in local_proc.stderr
    assert "bno-hvd: note:" not in proc.stderr, proc.stderr[-2000:]
