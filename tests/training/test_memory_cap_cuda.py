"""``--max-batch auto`` on a GPU, with a batch that does not fit whole (skipped without a CUDA
device; the GPU check's part ``max-batch-auto``).

``tests.support.gpu_models:memory_hungry`` keeps about 2 GiB per sample in float64, so the global
batch of 128 needs ~260 GiB, more than an H200's 141 GB: ``bno-hvd train --max-batch auto``
measures the cap from one pass (``bno_hvd.processes.device.measure_cap``) and runs each update
in passes under it. ``memory_light`` is the same function of the same parameters on a 36x
smaller tiling (``tests/support/gpu_models.py``), whose whole batch runs in one pass: the two
runs' parameters after 2 updates must agree within 1e-10, the micro-batched update being the
whole batch's. The cap is measured again here, and the whole batch tried: out of memory."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from support.checks import max_relative_difference
from support.gpu import needs_gpu
from support.gpu_models import memory_hungry
from support.jobs import assert_ok, torchrun
from support.train_runs import saved_model, train_args

from bno_hvd.processes.device import Device, measure_cap
from bno_hvd.training.results import steps_from_json

pytestmark = [pytest.mark.mpi, needs_gpu]

BATCH = 128


def train(tmp_path, name, model, *extra):
    flags = ["--engine", "torch", "--device", "cuda", "--dataset", "synthetic"]
    flags += ["--model", f"tests.support.gpu_models:{model}", "--strategy", "fixed", "--batch-sizes", str(BATCH)]
    args = train_args(tmp_path / f"{name}.pt", tmp_path / name, *flags, *extra, updates=2, momentum=0.9)
    proc = torchrun(1, ["-m", "bno_hvd", *args], timeout=150)
    assert_ok(proc)
    steps = steps_from_json(json.loads((tmp_path / name / "ranks.json").read_text()))
    return saved_model(tmp_path / f"{name}.pt"), [s.micro_batches for s in steps[0]]  # rank 0's updates


def test_max_batch_auto_splits_a_batch_that_does_not_fit_and_updates_as_whole(tmp_path, record_property):
    capped, passes = train(tmp_path, "hungry", "memory_hungry", "--max-batch", "auto")
    whole, whole_passes = train(tmp_path, "light", "memory_light")
    diff = max_relative_difference(capped, whole)
    record_property("passes_per_update", max(passes))
    record_property("micro_vs_whole", diff)
    # here, after both runs (their memory is free again): the cap as the run measured it, and the whole batch
    model = memory_hungry().to("cuda", torch.float64)
    cap = measure_cap(model, (1, 28, 28), Device("cuda:0"))
    record_property("cap_samples", cap)
    record_property("gpu_memory_gib", round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    oom = False
    try:
        x = torch.rand(BATCH, 1, 28, 28, dtype=torch.float64, device="cuda")
        F.cross_entropy(model(x), torch.zeros(BATCH, dtype=torch.long, device="cuda")).backward()
    except torch.cuda.OutOfMemoryError:
        oom = True
    finally:
        x = model = None
        torch.cuda.empty_cache()
    record_property("whole_batch_out_of_memory", oom)
    print(f"--max-batch auto: cap {cap}, {passes} passes per update; micro-batched vs whole {diff:.2e}")
    assert oom and cap < BATCH
    # (this process measured its own cap: the run's may differ by a sample or two)
    assert whole_passes == [1, 1] and all(p >= 2 and abs(p - math.ceil(BATCH / cap)) <= 1 for p in passes), passes
    assert diff <= 1e-10
