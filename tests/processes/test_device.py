"""Device selection (pure, checked here on a CPU machine for every case a GPU cluster has), the
memory cap derived from a measured step, mixed precision on the CPU (bfloat16, a real run), and
the GPU tests, which skip with the reason where there is no CUDA device."""

import re

import pytest
import torch
from support.jobs import assert_ok, bno_cmd, horovodrun, torchrun

from bno_hvd.common.errors import UsageError
from bno_hvd.processes.device import Device, derive_cap, select_device

NO_GPU = "no CUDA device on this machine (torch.cuda.is_available() is False)"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)


@pytest.mark.parametrize(
    "requested,available,count,local_rank,expected",
    [
        ("auto", False, 0, 0, "cpu"),  # this machine
        ("auto", True, 4, 2, "cuda:2"),  # one GPU per local rank
        ("auto", True, 0, 0, "cpu"),  # a CUDA build of torch with no device visible
        ("cpu", True, 4, 3, "cpu"),
        ("cuda", True, 2, 1, "cuda:1"),
    ],
)
def test_device_selection(requested, available, count, local_rank, expected):
    assert select_device(requested, available, count, local_rank) == expected


def test_device_selection_errors_say_what_to_do():
    with pytest.raises(UsageError, match="no CUDA device here.*use --device cpu or auto"):
        select_device("cuda", False, 0, 0)
    with pytest.raises(UsageError, match="2 GPU\\(s\\) but runs a rank with local rank 3.*at most 2 ranks per host"):
        select_device("auto", True, 2, 3)
    with pytest.raises(UsageError, match="--device 'tpu'"):
        select_device("tpu", False, 0, 0)


def test_a_cap_from_measured_memory_per_sample():
    # 2 GiB of model and optimizer, a 64-sample pass peaked 1 GiB above that: 16 MiB per sample;
    # 90% of a 16 GiB device leaves 12.4 GiB: 793 samples per pass
    gib = 2**30
    assert derive_cap(3 * gib, 2 * gib, 64, 16 * gib) == int((0.9 * 16 * gib - 2 * gib) // (gib / 64))
    with pytest.raises(UsageError, match="leaves room for no sample"):
        derive_cap(3 * gib, 2 * gib, 64, 2 * gib)


def test_cpu_device_and_bfloat16_autocast():
    device = Device("cpu", amp=True)
    assert not device.is_cuda and device.grad_scaler() is None
    device.synchronize()  # a no-op on the CPU
    with device.autocast():
        out = torch.nn.Linear(4, 2)(torch.ones(3, 4))
    assert out.dtype == torch.bfloat16


@pytest.mark.mpi
def test_mixed_precision_on_the_cpu_trains(tmp_path):
    proc = horovodrun(
        2,
        bno_cmd(
            "train",
            "--dataset",
            "synthetic",
            "--amp",
            "--device",
            "cpu",
            "--updates",
            "30",
            "--base-batch-size",
            "16",
            "--lr",
            "0.05",
            "--no-progress",
            "--latency-interval",
            "0",
            "--log-dir",
            str(tmp_path),
        ),
        timeout=300,
    )
    assert_ok(proc)
    acc = float(re.search(r"test accuracy: ([0-9.]+)", proc.stdout).group(1))
    assert acc > 0.3, proc.stdout[-1000:]


@pytest.mark.mpi
@needs_gpu
def test_gpu_ranks_train_with_amp_and_a_derived_cap(tmp_path, record_property):
    """One rank per GPU on the torch engine (no Horovod needed: the GPU check's machine has none),
    float16 with a GradScaler, the memory cap measured (--max-batch auto)."""
    args = ["train", "--engine", "torch", "--dataset", "synthetic", "--device", "cuda", "--amp", "--max-batch", "auto"]
    args += ["--updates", "40", "--no-progress", "--latency-interval", "0", "--log-dir", str(tmp_path)]
    proc = torchrun(torch.cuda.device_count(), ["-m", "bno_hvd", *args], timeout=240)
    assert_ok(proc)
    acc = float(re.search(r"test accuracy: ([0-9.]+)", proc.stdout).group(1))
    record_property("amp_test_accuracy", acc)
    assert "over nccl" in proc.stderr and acc > 0.3, proc.stdout[-1000:]


@needs_gpu
def test_cuda_timing_waits_for_the_gpu(record_property):
    """A step's compute ends when the GPU's queued work does, not when Python has queued it: with the
    device's synchronize (what the Balancer's clock gets on a GPU) 0.2 s of GPU work
    (``torch.cuda._sleep``) times as at least that; without it, as the launch alone."""
    from bno_hvd.library.timing import StepTimer

    device = Device.for_rank("cuda", 0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for spin in ("first", "second"):  # the first warms up (H200, 2026-11-29: timed from it, 0.2 s came out 0.077 s)
        start.record()
        torch.cuda._sleep(10**7)
        end.record()
        torch.cuda.synchronize()
        record_property(f"calibration_{spin}_s", round(start.elapsed_time(end) / 1e3, 4))
    cycles = int(10**7 * 0.2 / (start.elapsed_time(end) / 1e3))  # 0.2 s of the GPU spinning
    timed = {}
    for name, sync in (("synced", device.synchronize), ("unsynced", None)):
        timer = StepTimer(window=4, sync=sync, schedstat=False)
        timer.start()
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        timer.mark_backward_end()
        timed[name] = timer.end_compute(1)
        torch.cuda.synchronize()
        timed[f"{name}_gpu"] = start.elapsed_time(end) / 1e3
    for key, value in timed.items():
        record_property(f"{key}_s", round(value, 4))
    assert timed["synced"] >= 0.95 * timed["synced_gpu"] and timed["synced_gpu"] > 0.05, timed
    assert timed["unsynced"] < 0.5 * timed["unsynced_gpu"], timed


@needs_gpu
def test_gpu_memory_is_what_the_monitor_reports(record_property):
    from bno_hvd.library.control.monitor import process_memory_bytes

    x = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda:0")
    record_property("monitor_mib_for_64", round(process_memory_bytes("cuda:0") / 2**20, 1))
    assert process_memory_bytes("cuda:0") >= x.numel()
