"""Exact BatchNorm and a GradScaler across a sit-out, on CUDA (the GPU twin of
test_exact_library.py; skipped without a CUDA device, run by the GPU check's parts
``exact-batchnorm`` and ``cuda-tests``).

``tests/support/mpi_scripts/exact_cuda_cases.py`` runs the cases under torchrun, every rank on
GPU 0 (Gloo sums the CUDA tensors; NCCL takes one rank per GPU):

- the DDP drop-in (``bno.DistributedDataParallel``, ``bno.exact``): an MLP with ``BatchNorm1d``
  (12 updates) and torchvision's ``resnet18`` (4), float64, 4 ranks whose split changes every 2
  updates with a rank at 1 sample, equal one process (torch's own BatchNorm) within 1e-10;
- float16 autocast with ``torch.amp.GradScaler("cuda")`` on the torch engine, rank 3 sitting out
  while the scale doubles: every computing rank holds rank 0's scale and state at every update.
"""

import json
from pathlib import Path

import pytest
import torch
from support.checks import max_relative_difference
from support.gpu import needs_gpu
from support.jobs import assert_ok, torchrun

pytestmark = [pytest.mark.mpi, needs_gpu]

SCRIPT = "tests/support/mpi_scripts/exact_cuda_cases.py"


def run_job(np_, out, cases):
    out.mkdir()
    proc = torchrun(np_, [SCRIPT, str(out), *cases], timeout=240)
    assert_ok(proc)
    return out


@pytest.fixture(scope="module")
def ddp_four(tmp_path_factory):
    return run_job(4, tmp_path_factory.mktemp("exact-cuda") / "four", ["ddp:mlp", "ddp:resnet18"])


@pytest.fixture(scope="module")
def ddp_one(tmp_path_factory):
    return run_job(1, tmp_path_factory.mktemp("exact-cuda") / "one", ["ddp:mlp:plain", "ddp:resnet18:plain"])


def result(out: Path, case):
    where = out / case.replace(":", "-")
    return torch.load(where / "model.pt", weights_only=True), json.loads((where / "updates.json").read_text())


def running_stats(state):
    return {k: v for k, v in state.items() if "running_" in k}


@pytest.mark.parametrize("model,updates", [("mlp", 12), ("resnet18", 4)])
def test_exact_batchnorm_on_cuda_equals_one_process(model, updates, ddp_four, ddp_one, record_property):
    four, rows = result(ddp_four, f"ddp:{model}")
    one, _ = result(ddp_one, f"ddp:{model}:plain")
    sizes = [r["sizes"] for r in rows]
    assert len(sizes) == updates and all(1 in s and sum(s) == 16 for s in sizes)
    diff = max_relative_difference(four, one)
    stats = max_relative_difference(running_stats(four), running_stats(one))
    record_property(f"{model}_vs_one", diff)
    record_property(f"{model}_running_stats_vs_one", stats)
    record_property(f"{model}_rank_differences", sum(max(r["diff"]) > 0 for r in rows))
    print(f"DDP drop-in on CUDA, {model}: 4 ranks vs 1 process {diff:.2e} (running statistics {stats:.2e})")
    assert all(max(r["diff"]) == 0 for r in rows)  # every rank holds the same state after every update
    assert running_stats(one) and diff <= 1e-10 and stats <= 1e-10


def test_the_loss_scale_travels_with_a_rank_back_on_cuda(tmp_path, record_property):
    out = run_job(4, tmp_path / "float16", ["float16:mlp"])
    _, rows = result(out, "float16:mlp")
    out_at = [u for u, r in enumerate(rows[:-1]) if r["sizes"][3] == 0]
    scales = [r["scales"][0] for r in rows]
    mismatches = states = 0
    for r in rows:
        computing = [i for i, c in enumerate(r["computed"]) if c]
        mismatches += len({r["scales"][i] for i in computing}) != 1
        states += any(r["diff"][i] != 0 for i in computing)
    record_property("scale_mismatches", mismatches)
    record_property("state_mismatches", states)
    record_property("scale_first_last", f"{scales[0]:g}->{scales[-1]:g}")
    assert out_at and max(out_at) + 1 < len(rows) - 1, [r["sizes"] for r in rows]
    assert scales[max(out_at)] != scales[min(out_at) - 1], scales  # the scale moved while rank 3 was out
    assert all(not r["computed"][3] for r in rows if r["sizes"][3] == 0)
    assert mismatches == 0 and states == 0, rows
