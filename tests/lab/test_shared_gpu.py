"""REAL GPU heterogeneity on one GPU (skipped without a CUDA device; the GPU check's part
``shared-gpu``, the REAL GPU row of docs/benchmarks.md).

Four ranks share the one GPU with different shares of it (``bno_hvd/lab/gpushares.py``): under
CUDA MPS at 100, 50, 25 and 10% of its multiprocessors where an MPS daemon starts, training
``tests.support.gpu_models:wide_conv`` (compute-bound: a rank's share decides its speed);
otherwise one rank on the GPU beside three on the CPU with the baseline CNN, the most uneven
cluster one GPU makes. ``bno-hvd bench --rounds`` on the torch engine (Gloo: NCCL takes one rank
per GPU and no CPU ranks) interleaves ``balanced``, ``equal`` and ``lbbsp`` in random rounds; the
test records the paired ratios (the check's target: ``balanced`` >= 0.97x the top peer) and
asserts only that the comparison ran: speed is what it measures, not what it checks."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from support.gpu import needs_gpu, part_dir
from support.jobs import assert_ok, torchrun

from bno_hvd.lab.gpushares import MPS_FOLDER, describe, mps_env, start_mps, stop_mps

pytestmark = [pytest.mark.mpi, pytest.mark.alone, needs_gpu]

MPS = ("gpu:100,gpu:50,gpu:25,gpu:10", ["--model", "tests.support.gpu_models:wide_conv", "--base-batch-size", "256"])
MIXED = ("gpu,cpu,cpu,cpu", ["--model", "cnn", "--base-batch-size", "64"])
STRATEGIES = "balanced,equal,lbbsp"


def bench_args(spec, model, out, updates=60, warmup=20, rounds=4):
    """The torchrun arguments of one bench job whose ranks sit where ``spec`` says."""
    run = ["bench", "--engine", "torch", "--collectives", "gloo", "--device", "auto", "--dataset", "synthetic"]
    run += [*model, "--strategies", STRATEGIES, "--updates", str(updates), "--warmup", str(warmup)]
    run += ["--rounds", str(rounds), "--threads", "4", "--no-progress", "--latency-interval", "0", "--out", str(out)]
    return ["-m", "bno_hvd.lab.gpushares", spec, "--", sys.executable, "-m", "bno_hvd", *run]


def bench_numbers(rows: list[dict]) -> dict:
    """What the report shows of bench.json: samples/s per strategy, balanced's paired ratios."""
    by = {r["strategy"]: r for r in rows}
    numbers = {f"{name}_samples_per_s": round(r["samples_per_s"], 1) for name, r in by.items()}
    paired = by["balanced"]["paired"]
    numbers["balanced_vs_equal"] = paired["median"]
    numbers["balanced_vs_top_peer"] = paired["vs_top_peer"][0]
    numbers["vs_top_peer_interval"] = "[{}, {}]".format(*(f"{v:.3f}" if v else "-" for v in paired["vs_top_peer"][1:]))
    numbers["top_peer"] = paired["top_peer"]
    return numbers


def test_ranks_sharing_one_gpu_compare_balanced_with_equal_and_lbbsp(tmp_path, record_property):
    folder = Path(part_dir(tmp_path))
    mps, why = start_mps(MPS_FOLDER)
    spec, model = MPS if mps else MIXED
    record_property("profile", describe(spec))
    record_property("mps", f"yes: a client at 50% sees {why} SMs" if mps else f"no: {why}")
    try:
        env = mps_env(MPS_FOLDER) if mps else {}
        proc = torchrun(4, bench_args(spec, model, folder / "bench"), timeout=300, env=env)
    finally:
        stop_mps(MPS_FOLDER)
    (folder / "bench-output.txt").write_text(proc.stdout + proc.stderr)
    if importlib.util.find_spec("matplotlib") is None:  # the GPU machine's python may lack it: bench
        # writes bench.json, then fails at its figures (bench.png): the comparison itself ran
        record_property("figures", "not drawn: no matplotlib")
        assert "No module named 'matplotlib'" in proc.stderr, proc.stderr[-3000:]
    else:
        assert_ok(proc)
    rows = json.loads((folder / "bench" / "bench.json").read_text())
    for name, value in bench_numbers(rows).items():
        record_property(name, value)
    assert {r["strategy"] for r in rows} == set(STRATEGIES.split(","))
    assert all(len(r["paired"]["rates"]) == 4 for r in rows), rows
    print(proc.stdout[-3000:], file=sys.stderr if os.environ.get("GPU_CHECK_PART_DIR") else sys.stdout)
