"""Throughput lost per membership change: ``--elastic`` beside a checkpoint-restart, in one run.

Both modes train the same job on 4 CPU ranks (Fashion-MNIST, ``--global-batch 64``,
``--strategy balanced``). At update ``--at`` one worker gets a real SIGKILL. Measured from the
ledger's commit clock (``<log-dir>/ledger.jsonl``, wall clock per committed update):

- *stall*: seconds from the kill to the first committed update past the last one committed
  before it (an update redone after a restart does not count as progress);
- *lost*: the stall minus one update's median time after it: the seconds of training lost to
  the membership change (the time no update would have taken).

Modes:

- elastic: ``bno-hvd elastic -n 4 -- train --engine torch --elastic``: the survivors re-form in
  their own processes and go on with 3 ranks; then SIGUSR1 adds a worker and its join is
  measured the same way (the largest gap between commits after the request, minus the median);
- restart: what torchrun's default gives, every worker stopped and the job started again from its
  last checkpoint: ``torchrun --standalone --nproc-per-node 4 -m bno_hvd train --engine torch
  --checkpoint-every C --resume``, killed, then the same command again (it resumes from the
  newest checkpoint; the killed worker comes back, as torchrun restarts every worker). Its
  checkpoint cost per update is printed too (median update time beside the elastic run's).
  torchrun's own restart (``--max-restarts 1``) is not used: on this machine its restarted
  workers failed to connect their Gloo group ("Connection refused", torch 2.13), so the job is
  started again by this script, which costs torchrun's start (about a second) more.

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
from bno_hvd.training.ledger import committed_entries


def commits(log_dir: str) -> list[tuple[int, float]]:
    """``(update, commit wall clock)`` of each committed update in the ledger, in file order."""
    return [(entry["update"], entry["at"]) for entry in committed_entries(log_dir)]


def wait_commits(log_dir: str, count: int, proc, limit: float = 600) -> None:
    end = time.monotonic() + limit
    while len(commits(log_dir)) < count:
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"the job ended or stalled before update {count} (exit {proc.poll()})")
        time.sleep(0.01)


def worker_pids(proc) -> list[psutil.Process]:
    """The training processes under a launcher (the python processes that run bno_hvd train)."""
    return [p for p in psutil.Process(proc.pid).children(recursive=True) if "train" in " ".join(p.cmdline())]


def median_gap(times: list[float]) -> float:
    return statistics.median(b - a for a, b in zip(times, times[1:]))


def change_cost(entries: list[tuple[int, float]], at: float, done: int) -> dict:
    """Stall and lost seconds of a change at wall clock ``at``, when ``done`` updates were committed."""
    after = [t for u, t in entries if u >= done and t > at]
    stall = after[0] - at
    return {"stall_s": stall, "lost_s": stall - median_gap(after[1:21]), "update_s": median_gap(after[1:21])}


def train_args(data: str, log: str, updates: int) -> list[str]:
    return [
        "train", "--engine", "torch", "--data-dir", data, "--global-batch", "64", "--updates", str(updates),
        "--no-eval", "--no-progress", "--latency-interval", "0", "--log-dir", log, "--strategy", "balanced",
    ]  # fmt: skip


def kill_one(proc, log: str) -> tuple[float, int]:
    """SIGKILL the second worker; the wall clock and how many updates were committed by then."""
    victim = sorted(worker_pids(proc), key=lambda p: p.pid)[1]
    killed = time.time()
    victim.send_signal(signal.SIGKILL)
    return killed, len(commits(log))


def elastic_round(opts, work: str) -> dict:
    log = os.path.join(work, "elastic")
    args = train_args(opts.data_dir, log, opts.updates) + ["--elastic-timeout", str(opts.elastic_timeout)]
    cmd = [sys.executable, "-m", "bno_hvd", "elastic", "-n", "4", "--max-ranks", "5", "--", *args]
    proc = subprocess.Popen(cmd, env=mpi_env(), stderr=subprocess.DEVNULL)
    wait_commits(log, opts.at, proc)
    before = median_gap([t for _, t in commits(log)][2 : opts.at])
    killed, done = kill_one(proc, log)
    wait_commits(log, done + 20, proc)
    proc.send_signal(signal.SIGUSR1)  # one more worker: it starts, then joins at an update boundary
    asked_done = len(commits(log))
    rc = proc.wait(timeout=900)
    entries = commits(log)
    kill = change_cost(entries, killed, done)
    joined = [(u, t) for u, t in entries if u >= asked_done]
    gaps = [b - a for (_, a), (_, b) in zip(joined, joined[1:])]
    join_lost = max(gaps) - statistics.median(gaps) if gaps else float("nan")
    return {"rc": rc, "update_s_before": before, **kill, "join_lost_s": join_lost}


def restart_round(opts, work: str) -> dict:
    log, ckpt = os.path.join(work, "restart"), os.path.join(work, "ckpt")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    args = train_args(opts.data_dir, log, opts.updates)
    args += ["--checkpoint-dir", ckpt, "--checkpoint-every", str(opts.checkpoint_every), "--resume"]
    cmd = [torchrun, "--standalone", "--nproc-per-node", "4", "--max-restarts", "0", "-m", "bno_hvd", *args]
    env = {**mpi_env(), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    wait_commits(log, opts.at, proc)
    before = median_gap([t for _, t in commits(log)][2 : opts.at])
    killed, done = kill_one(proc, log)
    first_rc = proc.wait(timeout=300)  # torchrun stops every worker and ends
    again = subprocess.run(cmd, env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL, timeout=900)
    entries = commits(log)
    redone = done - min(u for u, t in entries if t > killed)
    return {"rc": again.returncode, "first_rc": first_rc, "update_s_before": before, "redone": redone,
            "checkpoint_every": opts.checkpoint_every, **change_cost(entries, killed, done)}  # fmt: skip


def summary(rows: list[dict]) -> list[str]:
    def med(mode, key):
        return statistics.median(r[key] for r in rows if r["mode"] == mode)

    def kill(mode):
        return f"{med(mode, 'lost_s'):.2f} s (kill -> next update {med(mode, 'stall_s'):.2f} s)"

    n = sum(r["mode"] == "elastic" for r in rows)
    return [
        f"throughput lost per membership change, seconds of training (median of {n} round(s)):",
        f"  elastic, SIGKILL of 1 of 4: {kill('elastic')}",
        f"  elastic, a worker joins:    {med('elastic', 'join_lost_s'):.2f} s",
        f"  restart, SIGKILL of 1 of 4: {kill('restart')}, {med('restart', 'redone'):g} update(s) redone",
        f"  update time before the kill: elastic {med('elastic', 'update_s_before'):.3f} s, "
        f"restart (a checkpoint every {rows[1]['checkpoint_every']}) {med('restart', 'update_s_before'):.3f} s",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--at", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--elastic-timeout", type=float, default=30.0, help="train --elastic-timeout (its default)")
    parser.add_argument("--checkpoint-every", type=int, default=1, help="restart mode: updates between checkpoints")
    opts = parser.parse_args()
    rows = []
    for round_ in range(opts.rounds):  # interleaved: elastic, then restart, each round
        for name, run in (("elastic", elastic_round), ("restart", restart_round)):
            with tempfile.TemporaryDirectory() as work:
                row = {"round": round_, "mode": name, **run(opts, work)}
            rows.append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    print("\n".join(summary(rows)))
    if any(r["rc"] != 0 for r in rows):
        sys.exit("a job did not end with 0 (its row's rc): the figures above are not a clean comparison")


if __name__ == "__main__":
    main()
