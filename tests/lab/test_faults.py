"""Faults during training: a rank killed with SIGKILL, a loss that becomes non-finite, a rank
whose metrics turn NaN, and memory caps that no forward/backward pass may exceed.

The multi-rank tests run the real ``bno-hvd train`` under horovodrun/mpirun on 2 ranks (a job of
more ranks ends the same way, and the allocation keeps one good split whatever the count). The
SIGKILL is sent from outside to a real rank process; NaN loss comes from a real divergence (huge --lr);
NaN metrics use ``--inject-fault`` (bno_hvd/lab/faults.py), which only chooses *when* a real NaN
enters the control plane.
"""

import json
import math
import os
import signal
import subprocess
import time
from types import SimpleNamespace

import psutil
import pytest
import torch
from support.jobs import VENV_BIN, assert_ok, bno_cmd, mpi_env, mpirun

from bno_hvd.allocation import make_strategy
from bno_hvd.common.errors import UsageError
from bno_hvd.lab.faults import FaultInjector, parse_faults
from bno_hvd.lab.logread import read_updates
from bno_hvd.library.control.plane import RankReport, allocate_on_root
from bno_hvd.training.checkpoint import list_checkpoints, parameters_finite
from bno_hvd.training.results import steps_from_json

QUICK = ["--dataset", "synthetic", "--no-eval", "--no-progress"]


# -- pure parts -------------------------------------------------------------------------------


def report(rank, ops=100.0, memory=1e9, row=None, cap=None, n=4):
    row = row if row is not None else [0.0 if j == rank else 1e-3 for j in range(n)]
    return RankReport(rank, ops, memory, row, [(16, 16 / ops)] if ops and math.isfinite(ops) and ops > 0 else [], cap)


@pytest.mark.parametrize(
    "bad",
    [
        {"ops": float("nan")},
        {"ops": None},
        {"ops": float("inf")},
        {"ops": 0.0},
        {"memory": float("nan")},
        {"row": [1e-3, 0.0, float("inf"), 1e-3]},
    ],
    ids=["nan-ops", "missing-ops", "inf-ops", "zero-ops", "nan-memory", "inf-latency"],
)
def test_bad_metrics_from_one_rank_keep_the_last_allocation(bad):
    current = [10, 20, 30, 4]
    for name in ("balanced", "bno", "lbbsp"):
        reports = [report(r) for r in range(4)]
        reports[1] = report(1, **bad)
        sizes, warning = allocate_on_root(make_strategy(name, 4, 16), reports, current, 10)
        assert sizes == current, name
        assert "rank(s) [1]" in warning and "kept the last allocation" in warning


def test_a_memory_cap_no_longer_bounds_the_allocation():
    # a share above a rank's cap is processed in micro-batches: the control plane passes it on
    reports = [report(r, cap=12) for r in range(4)]
    sizes, warning = allocate_on_root(
        make_strategy("fixed", 4, 16, batch_sizes=[20, 4, 4, 4]), reports, [8, 8, 8, 8], 5
    )
    assert sizes == [20, 4, 4, 4] and warning is None
    # a rank 4x faster than the others gets its share by speed, whatever its cap
    fast = [report(0, ops=400.0, cap=20)] + [report(r, ops=100.0, cap=20) for r in range(1, 4)]
    for name in ("balanced", "proportional", "lbbsp"):
        sizes, _ = allocate_on_root(make_strategy(name, 4, 16), fast, [16] * 4, 10)
        assert sizes[0] > 20 and sum(sizes) == 64 and min(sizes) >= 1, (name, sizes)


def test_fault_specs():
    assert parse_faults("kill:2:25,nan-loss:0:3") == [parse_faults("kill:2:25")[0], parse_faults("nan-loss:0:3")[0]]
    for bad in ("kill:2", "boom:1:1", "kill:x:1", "kill:1:-3"):
        with pytest.raises(UsageError, match="--inject-fault entry"):
            parse_faults(bad)
    faults = FaultInjector.parse("nan-loss:1:3", rank=1)
    loss = torch.tensor(2.0, requires_grad=True)
    at = SimpleNamespace
    assert faults.loss(loss, at(update=2)) is loss and math.isnan(faults.loss(loss, at(update=3)).item())
    assert FaultInjector.parse("nan-loss:1:3", rank=0).loss(loss, at(update=3)) is loss


def test_parameters_finite():
    model = torch.nn.Linear(3, 2)
    assert parameters_finite(model)
    with torch.no_grad():
        model.weight[0, 1] = float("inf")
    assert not parameters_finite(model)


# -- a rank dies ----------------------------------------------------------------------------


def rank_process(root_pid, rank):
    for child in psutil.Process(root_pid).children(recursive=True):
        try:
            if child.environ().get("OMPI_COMM_WORLD_RANK") == str(rank) and "python" in child.name():
                return child
        except psutil.Error:
            continue
    return None


@pytest.mark.mpi
def test_sigkill_of_one_rank_ends_the_job_within_60_seconds(tmp_path):
    log_dir = tmp_path / "log"
    cmd = [os.path.join(VENV_BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", "--mpi"] + bno_cmd(
        "train", *QUICK, "--updates", "100000", "--latency-interval", "1", "--log-dir", str(log_dir)
    )
    job = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env(), start_new_session=True
    )
    try:
        deadline = time.time() + 180
        while time.time() < deadline and job.poll() is None:
            if (log_dir / "updates.jsonl").exists() and len(read_updates(str(log_dir))) >= 5:
                break
            time.sleep(0.2)
        assert job.poll() is None, "the job ended before the kill"
        victim = rank_process(job.pid, 1)
        assert victim is not None, "rank 1 not found among the job's processes"
        t_kill = time.time()
        victim.send_signal(signal.SIGKILL)
        out, err = job.communicate(timeout=60)  # the deadline of the issue
        seconds = time.time() - t_kill
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    print(f"kill-to-exit: {seconds:.1f} s")
    assert job.returncode != 0
    text = out + err
    assert "rank 1" in text and "signal 9" in text, text[-3000:]
    assert not psutil.pid_exists(victim.pid) or victim.status() == psutil.STATUS_ZOMBIE
    records = read_updates(str(log_dir))  # the log holds whole lines up to the kill
    assert [r.update for r in records] == list(range(len(records)))


# -- non-finite loss ------------------------------------------------------------------------


@pytest.mark.mpi
def test_nonfinite_loss_stops_with_one_message_and_keeps_good_checkpoints(tmp_path):
    ckpt, log_dir = tmp_path / "ck", tmp_path / "log"
    proc = mpirun(
        2,
        bno_cmd(
            "train",
            *QUICK,
            "--strategy",
            "fixed",
            "--batch-sizes",
            "8,8",
            "--updates",
            "50",
            "--lr",
            "1e6",
            "--latency-interval",
            "0",
            "--checkpoint-dir",
            str(ckpt),
            "--checkpoint-every",
            "1",
            "--keep-checkpoints",
            "2",
            "--log-dir",
            str(log_dir),
        ),
        timeout=180,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "bno-hvd: error:" in line]
    assert len(lines) == 1 and "loss became nan" in lines[0] and "lower --lr" in lines[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    failed_at = int(lines[0].split("at update ")[1].split(";")[0])
    # the checkpoints before the failure are intact, loadable, finite; none was written after it
    found = list_checkpoints(str(ckpt))
    assert [u for u, _ in found] == [u for u in (failed_at - 1, failed_at) if u >= 1]
    for _, path in found:
        state = torch.load(path, map_location="cpu", weights_only=False)
        assert all(torch.isfinite(t).all() for t in state["model"].values())
    # the update log holds whole lines, one per finished update
    lines = (log_dir / "updates.jsonl").read_text().splitlines()
    assert [json.loads(line)["update"] for line in lines] == list(range(failed_at))


# -- NaN metrics and the memory cap, in one real run ----------------------------------------


@pytest.mark.mpi
def test_nan_metrics_keep_allocation_warn_once_and_no_pass_exceeds_the_cap(tmp_path):
    log_dir = tmp_path / "log"
    proc = mpirun(
        2,
        bno_cmd(
            "train",
            *QUICK,
            "--strategy",
            "random",  # a new split at every rebalance whatever the speeds (balanced's moves need a quiet machine)
            "--base-batch-size",
            "16",
            "--max-batch",
            "16",
            "--rebalance-every",
            "5",
            "--updates",
            "25",
            "--latency-interval",
            "1",
            "--inject-fault",
            "nan-metrics:1:10",
            "--log-dir",
            str(log_dir),
        ),
        timeout=180,
    )
    assert_ok(proc)
    records = read_updates(str(log_dir))
    sizes = [r.batch_sizes for r in records]
    assert len(sizes) == 25 and all(sum(s) == 32 for s in sizes)
    print("batch sizes at updates 0, 9, 10, 24:", sizes[0], sizes[9], sizes[10], sizes[24])
    assert sizes[9] != sizes[0]  # the run really rebalanced
    # the cap is the base batch: once a rank gets less than 16, the other gets more and runs two
    # micro-batches, never one of > 16
    steps = steps_from_json(json.loads((log_dir / "ranks.json").read_text()))
    assert any(s.batch > 16 for r in steps for s in r)
    assert all(s.micro_batches == -(-s.batch // 16) for r in steps for s in r)
    assert all(s == sizes[9] for s in sizes[10:])  # NaN from rank 1: the last good allocation stays
    warnings = [line for line in proc.stderr.splitlines() if "bno-hvd: warning:" in line]
    nan_warnings = [w for w in warnings if "non-finite metrics from rank(s) [1]" in w]
    assert len(nan_warnings) == 1, proc.stderr[-3000:]  # three rebalances saw it, one warning
    memory = [r.rank_memory for r in records if r.rank_memory]
    assert memory and all(len(m) == 2 for m in memory)
    assert all(m[1] is None for m in memory[-3:]) and all(m[0] > 0 for m in memory)
