"""Recovery from a membership change: ``--elastic`` beside torchrun's checkpoint-restart.

Both runs train the same job on 4 CPU ranks (Fashion-MNIST, ``--global-batch 64``). At update
``--at`` one worker gets a real SIGKILL. Measured from the ledger's commit times (wall clock):
the seconds from the kill to the next committed update, and the throughput lost, that minus one
update's median time before the kill.

- elastic: ``bno-hvd elastic -n 4 -- train --engine torch --elastic``: survivors re-form in
  their own processes; then SIGUSR1 adds a worker (the join's lost seconds are reported too);
- restart: ``torchrun --max-restarts 1 --nproc-per-node 4 -m bno_hvd train --engine torch
  --checkpoint-every 1 --resume``: torchrun stops every worker, starts 4 new ones, and they
  resume from the checkpoint written after every update (its cost per update is reported).

    python benchmarks/elastic_recovery.py --data-dir /usr/share/datasets/fashion-mnist --rounds 2
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

from bno_hvd.cli.launching import mpi_env


def commits(log_dir: str) -> list[float]:
    path = os.path.join(log_dir, "ledger.jsonl")
    out = []
    for line in open(path).read().splitlines()[1:] if os.path.exists(path) else []:
        try:
            out.append(json.loads(line)["at"])
        except (json.JSONDecodeError, KeyError):
            break
    return out


def wait_commits(log_dir: str, count: int, proc, limit: float = 600) -> None:
    end = time.monotonic() + limit
    while len(commits(log_dir)) < count:
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"the job ended or stalled before update {count}")
        time.sleep(0.01)


def worker_pids(proc) -> list[psutil.Process]:
    """The training processes under a launcher (the python processes that run bno_hvd train)."""
    return [p for p in psutil.Process(proc.pid).children(recursive=True) if "train" in " ".join(p.cmdline())]


def lost_after(times: list[float], at: float, before: int) -> tuple[float, float]:
    """(seconds from ``at`` to the next commit, that minus the median update time before)."""
    median = statistics.median(b - a for a, b in zip(times[: before - 1], times[1:before]))
    took = min(t for t in times if t > at) - at
    return took, took - median


def train_args(data: str, log: str, updates: int) -> list[str]:
    return [
        "train", "--engine", "torch", "--data-dir", data, "--global-batch", "64", "--updates", str(updates),
        "--no-eval", "--no-progress", "--latency-interval", "0", "--log-dir", log, "--strategy", "balanced",
    ]  # fmt: skip


def elastic_round(data: str, updates: int, at: int, work: str) -> dict:
    log = os.path.join(work, "elastic")
    cmd = [
        sys.executable,
        "-m",
        "bno_hvd",
        "elastic",
        "-n",
        "4",
        "--max-ranks",
        "5",
        "--",
        *train_args(data, log, updates),
    ]
    proc = subprocess.Popen(cmd, env=mpi_env(), stderr=subprocess.DEVNULL)
    wait_commits(log, at, proc)
    victim = sorted(worker_pids(proc), key=lambda p: p.pid)[1]
    killed = time.time()
    victim.send_signal(signal.SIGKILL)
    wait_commits(log, at + 10, proc)
    proc.send_signal(signal.SIGUSR1)  # one more worker
    joined_before = len(commits(log))
    rc = proc.wait(timeout=900)
    times = commits(log)
    took, lost = lost_after(times, killed, at)
    gaps = [b - a for a, b in zip(times[joined_before:], times[joined_before + 1 :])]
    median = statistics.median(b - a for a, b in zip(times[: at - 1], times[1:at]))
    return {"rc": rc, "kill_to_commit_s": took, "lost_s": lost, "join_lost_s": max(gaps) - median}


def restart_round(data: str, updates: int, at: int, work: str) -> dict:
    log, ckpt = os.path.join(work, "restart"), os.path.join(work, "ckpt")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    args = train_args(data, log, updates) + ["--checkpoint-dir", ckpt, "--checkpoint-every", "1", "--resume"]
    cmd = [torchrun, "--standalone", "--nproc-per-node", "4", "--max-restarts", "1", "-m", "bno_hvd", *args]
    proc = subprocess.Popen(cmd, env={**mpi_env(), "OMP_NUM_THREADS": "1"}, stderr=subprocess.DEVNULL)
    wait_commits(log, at, proc)
    victim = sorted(worker_pids(proc), key=lambda p: p.pid)[1]
    killed = time.time()
    victim.send_signal(signal.SIGKILL)
    rc = proc.wait(timeout=900)
    times = commits(log)
    took, lost = lost_after(times, killed, at)
    return {"rc": rc, "kill_to_commit_s": took, "lost_s": lost}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--updates", type=int, default=80)
    parser.add_argument("--at", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    opts = parser.parse_args()
    rows = []
    for round_ in range(opts.rounds):  # interleaved: elastic, then restart, each round
        for name, run in (("elastic", elastic_round), ("restart", restart_round)):
            with tempfile.TemporaryDirectory() as work:
                row = {"round": round_, "mode": name, **run(opts.data_dir, opts.updates, opts.at, work)}
            rows.append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    for name in ("elastic", "restart"):
        mine = [r for r in rows if r["mode"] == name]
        print(
            f"{name}: kill -> next committed update {statistics.median(r['kill_to_commit_s'] for r in mine):.2f} s "
            f"(median of {len(mine)}), throughput lost {statistics.median(r['lost_s'] for r in mine):.2f} s"
        )


if __name__ == "__main__":
    main()
