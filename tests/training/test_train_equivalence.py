"""The main correctness test: N ranks with a fixed uneven allocation produce the same
parameters as one process training on the whole global batch (baseline CNN, real
Fashion-MNIST, 20 updates, plain SGD and Adam), because each rank weights its mean loss by
n_r / sum(n) and Horovod sums the gradients.

Adam runs in float64: its update m/sqrt(v) turns float32 summation-order noise in
near-zero gradients into full-size steps (measured here: 2.6e-4 max relative difference in
float32 after 20 updates, 6e-14 in float64), so float32 would test rounding, not the method.
Plain SGD is linear in the gradient and is checked in float32."""

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import assert_ok, bno_cmd, horovodrun

pytestmark = pytest.mark.mpi


def train_and_save(np_, batch_sizes, optimizer, dtype, path, tmp_path, updates=20, extra=()):
    args = bno_cmd(
        "train",
        "--strategy",
        "fixed",
        "--batch-sizes",
        batch_sizes,
        "--updates",
        str(updates),
        "--optimizer",
        optimizer,
        "--momentum",
        "0",
        "--dtype",
        dtype,
        "--lr",
        "0.01",
        "--seed",
        "7",
        "--no-eval",
        "--no-progress",
        "--latency-interval",
        "0",
        "--save-model",
        str(path),
        "--log-dir",
        str(tmp_path / f"log-{np_}-{optimizer}"),
        *extra,
    )
    proc = horovodrun(np_, args, timeout=400)
    assert_ok(proc)
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.parametrize("optimizer,dtype", [("sgd", "float32"), ("adam", "float64")])
def test_uneven_ranks_equal_single_process(optimizer, dtype, tmp_path, fashion_available):
    multi = train_and_save(4, "5,11,3,13", optimizer, dtype, tmp_path / "multi.pt", tmp_path)
    single = train_and_save(1, "32", optimizer, dtype, tmp_path / "single.pt", tmp_path)
    assert multi.keys() == single.keys()
    diff = max_relative_difference(multi, single)
    print(f"{optimizer}: max relative difference {diff:.3e}")
    assert diff <= (1e-5 if dtype == "float32" else 1e-10)  # measured: 1.5e-7 (SGD, float32), 5.7e-14 (Adam)
    # and training really moved the parameters (not a comparison of two initialisations)
    from bno_hvd.data.models import build_model

    torch.manual_seed(7)
    init = build_model("cnn").to(getattr(torch, dtype)).state_dict()
    assert max_relative_difference(single, init) > 1e-3


def test_ranks_that_accumulate_micro_batches_equal_single_process(tmp_path, fashion_available):
    """Memory caps (one per rank) below the allocated batches: ranks 0, 1 and 3 split their share
    into micro-batches (5 -> 4+1, 11 -> 4+4+3, 13 -> 5+5+3) and accumulate gradients before the
    allreduce; the update must still be the single-process update on all 32 samples."""
    caps = ["--max-batch", "4,4,16,5"]
    multi = train_and_save(4, "5,11,3,13", "sgd", "float64", tmp_path / "multi.pt", tmp_path, extra=caps)
    single = train_and_save(1, "32", "sgd", "float64", tmp_path / "single.pt", tmp_path)
    diff = max_relative_difference(multi, single)
    print(f"accumulating ranks: max relative difference {diff:.3e}")
    assert diff <= 1e-10  # float64; measured 2.7e-16
    import json

    from bno_hvd.training.results import steps_from_json

    steps = steps_from_json(json.loads((tmp_path / "log-4-sgd" / "ranks.json").read_text()))
    assert [s[0].micro_batches for s in steps] == [2, 3, 1, 3]
