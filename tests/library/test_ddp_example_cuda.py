"""The DDP example (``examples/ddp_mnist.py``) on CUDA, and exact dropout's masks there (skipped
without a CUDA device; the GPU check's part ``ddp-example``).

The GPU machine has no Fashion-MNIST: the example reads IDX files made up here
(:func:`support.gpu.write_fashion_like`). One GPU takes one rank of the example (it picks NCCL
and GPU ``LOCAL_RANK``), so the example runs on 1 rank, once on the GPU and once with the GPU
hidden (Gloo, the CPU), both through tests/support/run_port.py (float64, the model kept). Exact
dropout's masks are computed by torch's integer operations on a GPU and by numpy on the CPU
(``bno_hvd/library/dropmask.py``): the same bits, so the two runs train alike.
"""

import re

import numpy as np
import pytest
import torch
from support.checks import max_relative_difference
from support.gpu import needs_gpu, write_fashion_like
from support.jobs import TORCHRUN_EXIT_HANG, assert_ok, torchrun

from bno_hvd.library.dropmask import dropout_seed, keep_mask, mask_bits, mask_bits_numpy, row_terms

ARGS = ["--epochs", "1", "--batch-size", "64", "--log-interval", "16", "--seed", "5"]


@needs_gpu
def test_dropout_masks_on_cuda_are_the_cpus(record_property):
    terms = row_terms(np.array([dropout_seed(5, e, i, c) for e in (0, 3) for i in range(500) for c in (0, 1)]))
    for n in (1, 7, 320, 4096):
        on_gpu = mask_bits(torch.from_numpy(terms).cuda(), n).cpu().numpy()
        assert np.array_equal(on_gpu, mask_bits_numpy(terms, n).astype(np.int64)), n
    keep_gpu = keep_mask(terms, (20, 8, 8), 0.5, torch.device("cuda", 0)).cpu()
    keep_cpu = keep_mask(terms, (20, 8, 8), 0.5, torch.device("cpu"))
    record_property("mask_elements_differing", int((keep_gpu != keep_cpu).sum()))
    assert torch.equal(keep_gpu, keep_cpu)


def run_example(out, data, env=None):
    out.mkdir()
    cmd = ["tests/support/run_port.py", str(out), "examples/ddp_mnist.py", "--data-dir", str(data), *ARGS]
    proc = torchrun(1, cmd, timeout=120, done=[out / "done-0"], env=env)
    assert_ok(proc)
    line = re.search(r"test set: mean loss ([0-9.naninf]+), accuracy ([0-9.]+)%", proc.stdout)
    assert line, proc.stdout[-2000:]
    return torch.load(out / "model.pt", map_location="cpu", weights_only=True), float(line[1]), float(line[2])


@pytest.mark.mpi
@needs_gpu
@TORCHRUN_EXIT_HANG
def test_the_ddp_example_on_cuda_trains_as_on_the_cpu(tmp_path, record_property):
    data = write_fashion_like(tmp_path / "data", train=2048, test=512)
    cuda, loss, accuracy = run_example(tmp_path / "cuda", data)
    cpu, cpu_loss, _ = run_example(tmp_path / "cpu", data, env={"CUDA_VISIBLE_DEVICES": ""})
    diff = max_relative_difference(cuda, cpu)
    record_property("cuda_vs_cpu", diff)
    record_property("test_loss", loss)
    record_property("test_accuracy_pct", accuracy)
    print(f"examples/ddp_mnist.py, 1 epoch: CUDA vs CPU {diff:.2e}, test loss {loss:.4f} / {cpu_loss:.4f}")
    assert np.isfinite(loss) and diff <= 1e-8
