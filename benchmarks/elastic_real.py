"""REAL elastic profile: a slow rank leaves, a fast one joins; ``balanced`` against the best peer.

For each strategy ``--elastic`` accepts (``random`` is not a contender), one job

    bno-hvd elastic -n 4 --max-ranks 5 -- train --engine torch --elastic --global-batch 64 --strategy S

on Fashion-MNIST (``OMP_NUM_THREADS=1``), every worker held by a REAL cgroup v1 CPU limit set
outside bno-hvd (10 ms period): workers 0-3 at 0.45, 0.45, 0.45, 0.15 of a core. Once
``--leave-at`` updates are committed (the ledger's lines) the slow worker gets SIGTERM and leaves
at an update boundary; once ``--join-at`` are, SIGUSR1 to the agent adds worker 4, which this
script moves into a 0.45 cgroup as soon as its PID appears among the agent's children (it runs
unconfined for that moment, at most one poll of 20 ms, before its imports). The cgroups are
removed when a job ends, also when it fails or this script is interrupted; a reaper outside them
removes them if this script is killed (:mod:`bno_hvd.lab.elasticreal`).

Throughput of a job: samples committed after ``--warmup`` updates / (last commit - first commit
after the warm-up), from ``ledger.jsonl``'s commit clocks. Rounds run the strategies in an order
rotated by one each round; printed per round and as medians: each strategy's samples/s and
``balanced`` over the best peer (the best other strategy of the same round). As root, alone:

    .venv/bin/python benchmarks/elastic_real.py --rounds 2 --out runs/elastic-real
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from datetime import date

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bno_hvd.lab.elasticreal import PROFILE, STRATEGIES, Job, Schedule, rotated, run_job  # noqa: E402


def summary(rows: list[dict], rounds: int) -> list[str]:
    rates = {s: [r["samples_per_s"] for r in rows if r["strategy"] == s] for s in STRATEGIES}
    ratios = []
    lines = ["| round | " + " | ".join(STRATEGIES) + " | balanced / best peer |", "|---" * (len(STRATEGIES) + 2) + "|"]
    for k in range(rounds):
        mine = {s: rates[s][k] for s in STRATEGIES}
        peer = max((s for s in STRATEGIES if s != "balanced"), key=mine.get)
        ratios.append(mine["balanced"] / mine[peer])
        cells = " | ".join(f"{mine[s]:.1f}" for s in STRATEGIES)
        lines.append(f"| {k} | {cells} | {ratios[-1]:.3f} ({peer}) |")
    medians = {s: statistics.median(v) for s, v in rates.items()}
    cells = " | ".join(f"**{medians[s]:.1f}**" for s in STRATEGIES)
    lines.append(f"| median | {cells} | **{statistics.median(ratios):.3f}** |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--updates", type=int, default=Schedule.updates)
    parser.add_argument("--warmup", type=int, default=Schedule.warmup)
    parser.add_argument("--leave-at", type=int, default=Schedule.leave_at)
    parser.add_argument("--join-at", type=int, default=Schedule.join_at)
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="those run (the table needs all)")
    parser.add_argument("--job-timeout", type=float, default=300.0)
    parser.add_argument("--out", default=None, help="where the logs and elastic_real.json go [a temporary folder]")
    opts = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # the cgroups' cleanup runs
    schedule = Schedule(opts.updates, opts.warmup, opts.leave_at, opts.join_at)
    out = opts.out or tempfile.mkdtemp(prefix="elastic-real-")
    rows = []
    for round_ in range(opts.rounds):
        for strategy in rotated(opts.strategies.split(","), round_):
            os.makedirs(os.path.join(out, f"round{round_}"), exist_ok=True)
            log = os.path.join(out, f"round{round_}", strategy)
            row = {"round": round_, **run_job(Job(strategy, schedule, opts.data_dir, log, opts.job_timeout))}
            rows.append(row)
            print(json.dumps(row), flush=True)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    with open(os.path.join(out, "elastic_real.json"), "w") as fh:
        head = {"date": str(date.today()), "commit": commit.stdout.strip(), "label": PROFILE.label()}
        json.dump({**head, "schedule": asdict(schedule), "rows": rows}, fh, indent=1)
    print(f"REAL ({PROFILE.label()}), {opts.rounds} round(s), samples/s:")
    if set(opts.strategies.split(",")) == set(STRATEGIES):
        print("\n".join(summary(sorted(rows, key=lambda r: r["round"]), opts.rounds)))
    if any(r["rc"] != 0 or not r["ledger_ok"] for r in rows):
        sys.exit("a job did not end with 0 or its ledger check failed (its row): not a clean comparison")


if __name__ == "__main__":
    main()
