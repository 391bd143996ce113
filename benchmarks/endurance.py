"""Endurance: does every rank's memory stay flat over a long run?

Runs ``bno-hvd train`` on N ranks (default 4, 2400 updates of the baseline CNN on Fashion-MNIST)
with the background metrics thread sampling memory and probing latency, and reads back the
per-rank RSS that rank 0 logs at every rebalance (``rank_memory`` in ``updates.jsonl``).
Growth is measured from the end of warm-up (default: the first rebalance at or after 10% of the
updates; allocator pools and caches fill up before that) to the end. Target: < 5% per rank.

Usage (from the repository root; takes several minutes on 2 cores)::

    source launch/mpi-env
    python benchmarks/endurance.py --updates 2400 --out runs/endurance
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from bno_hvd.cli.launching import mpi_env, mpirun_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_growth(records: list[dict], warmup_updates: int) -> list[dict]:
    """Per rank: RSS (bytes) at the end of warm-up, at the end, the peak after warm-up, and the
    growth ``(end - warm) / warm``. ``records`` are update-log records; only those with
    ``rank_memory`` (rebalances) are used. Pure: no clock, no processes."""
    samples = [(r["update"], r["rank_memory"]) for r in records if r.get("rank_memory")]
    after = [(u, m) for u, m in samples if u >= warmup_updates]
    if len(after) < 2:
        raise ValueError(f"need at least two memory samples after update {warmup_updates}, got {len(after)}")
    (u0, warm), (u1, end) = after[0], after[-1]
    out = []
    for rank in range(len(warm)):
        series = [m[rank] for _, m in after if m[rank] is not None]
        out.append(
            {
                "rank": rank,
                "from_update": u0,
                "to_update": u1,
                "warm_bytes": warm[rank],
                "end_bytes": end[rank],
                "peak_bytes": max(series),
                "growth": (end[rank] - warm[rank]) / warm[rank],
                "peak_growth": (max(series) - warm[rank]) / warm[rank],
            }
        )
    return out


def run_endurance(out_dir: str, updates: int, ranks: int, extra: list[str]) -> dict:
    """Run the job (real mpirun) and return its growth figures and wall time."""
    log_dir = os.path.join(out_dir, "log")
    shutil.rmtree(log_dir, ignore_errors=True)
    args = [
        sys.executable,
        "-m",
        "bno_hvd",
        "train",
        "--updates",
        str(updates),
        "--model",
        "cnn",
        "--rebalance-every",
        "10",
        "--latency-interval",
        "1",
        "--no-eval",
        "--no-progress",
        "--log-dir",
        log_dir,
        *extra,
    ]
    cmd = mpirun_command(ranks, args)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=mpi_env())
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"training failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(log_dir, "updates.jsonl")) as fh:
        records = [json.loads(line) for line in fh]
    warmup = next(r["update"] for r in records if r.get("rank_memory") and r["update"] >= updates // 10)
    return {
        "updates": updates,
        "ranks": ranks,
        "wall_seconds": wall,
        "warmup_update": warmup,
        "per_rank": rss_growth(records, warmup),
        "command": " ".join(cmd),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=2400)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", "endurance"))
    parser.add_argument("--target", type=float, default=0.05, help="allowed RSS growth after warm-up")
    args, extra = parser.parse_known_args(argv)  # anything else goes to `bno-hvd train`
    os.makedirs(args.out, exist_ok=True)
    result = run_endurance(args.out, args.updates, args.ranks, extra)
    print(
        f"{args.ranks} ranks, {args.updates} updates, {result['wall_seconds']:.0f} s; "
        f"RSS from update {result['warmup_update']} (end of warm-up) to the end:"
    )
    print(f"{'rank':>4} {'warm MiB':>9} {'end MiB':>8} {'peak MiB':>9} {'growth':>7} {'peak':>7}")
    for r in result["per_rank"]:
        print(
            f"{r['rank']:>4} {r['warm_bytes'] / 2**20:>9.1f} {r['end_bytes'] / 2**20:>8.1f} "
            f"{r['peak_bytes'] / 2**20:>9.1f} {r['growth']:>7.2%} {r['peak_growth']:>7.2%}"
        )
    worst = max(r["growth"] for r in result["per_rank"])
    print(f"worst growth {worst:.2%} (target < {args.target:.0%}): {'PASS' if worst < args.target else 'FAIL'}")
    with open(os.path.join(args.out, "endurance.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    return 0 if worst < args.target else 1


if __name__ == "__main__":
    sys.exit(main())
