"""The REAL elastic profile's pieces (``benchmarks/elastic_real.py``, :mod:`bno_hvd.lab.elasticreal`):
its schedule and round orders, its throughput from a ledger, and its cgroups, which a real job
that fails or is interrupted leaves behind neither as cgroups nor as processes."""

import json
import math
import os

import psutil
import pytest
from support.cgroups import needs_cgroups, our_cgroups, wait_until_gone

from bno_hvd.lab.elasticreal import STRATEGIES, Job, Schedule, phases, read_entries, rotated, run_job, throughput


def test_the_schedule_leaves_once_then_joins_once():
    schedule = Schedule(updates=100, warmup=10, leave_at=40, join_at=45)
    left = asked = False
    done = []
    for committed in range(0, 100):
        action = schedule.due(committed, left, asked)
        if action:
            done.append((committed, action))
        left, asked = left or action == "leave", asked or action == "join"
    assert done == [(40, "leave"), (45, "join")]
    assert schedule.due(60, left=False, asked=False) == "leave"  # a late look still leaves first
    with pytest.raises(ValueError, match="warmup < leave_at < join_at < updates"):
        Schedule(updates=100, warmup=10, leave_at=45, join_at=40)


def test_every_strategy_takes_every_place_once_over_as_many_rounds():
    orders = [rotated(STRATEGIES, k) for k in range(len(STRATEGIES))]
    assert all(sorted(order) == sorted(STRATEGIES) for order in orders)
    for place in range(len(STRATEGIES)):
        assert sorted(order[place] for order in orders) == sorted(STRATEGIES)
    assert "random" not in STRATEGIES and orders[0][0] == "balanced"


def entry(update, at, sizes, members):
    return {"update": update, "ranges": [], "sizes": sizes, "members": members, "at": at}


def test_throughput_counts_the_samples_after_the_first_timed_commit(tmp_path):
    lines = [{"ledger": 1, "dataset_len": 60000, "seed": 0}]
    lines += [entry(u, 100.0 + u, [16, 16, 16, 16], [0, 1, 2, 3]) for u in range(5)]
    lines += [entry(u, 100.0 + u * 0.5 + 2.5, [22, 21, 21], [0, 1, 2]) for u in range(5, 9)]
    lines += [entry(8, 107.0, [21, 22, 21], [0, 1, 2])]  # update 8 again, as a new rank 0 rewrites it
    (tmp_path / "ledger.jsonl").write_text("\n".join(map(json.dumps, lines)) + '\n{"update": 9, "ran')
    entries = read_entries(str(tmp_path))
    assert [e["update"] for e in entries] == list(range(9)) and entries[-1]["at"] == 107.0  # torn line left out
    # updates 3..8 timed: 5 x 64 samples after update 3's commit (103.0) up to update 8's (107.0)
    assert throughput(entries, warmup=3) == pytest.approx(5 * 64 / 4.0)
    assert math.isnan(throughput(entries, warmup=8))
    cut = phases(entries)
    assert [p["members"] for p in cut] == [[0, 1, 2, 3], [0, 1, 2]]
    assert [p["updates"] for p in cut] == [5, 4] and cut[1]["update_s"] == pytest.approx(0.5, abs=0.25)
    assert cut[1]["first_split"] == [22, 21, 21] and cut[1]["last_split"] == [21, 22, 21]
    assert cut[1]["settled_after"] == 3 and cut[0]["settled_after"] == 0


def no_processes_left(pids):
    gone, alive = psutil.wait_procs([p for p in map(_process, pids) if p], timeout=10)
    return not alive


def _process(pid):
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


@needs_cgroups
@pytest.mark.mpi
@pytest.mark.parametrize("how", ["failed", "interrupted"])
def test_a_job_that_fails_or_is_interrupted_leaves_no_cgroup(how, tmp_path, fashion_dir):
    before = our_cgroups(suite=True)
    data = str(tmp_path / "no-such-data") if how == "failed" else fashion_dir
    job = Job("balanced", Schedule(), data, str(tmp_path / "log"), timeout=60 if how == "failed" else 12)
    events = {}
    if how == "failed":  # the workers refuse the data (exit 2) and the agent ends the job: non-zero
        row = run_job(job, events)
        assert row["rc"] != 0 and math.isnan(row["samples_per_s"]), row
    else:  # the job runs past its time: stopped, with its workers
        with pytest.raises(TimeoutError):
            run_job(job, events)
    mine = [n for n in our_cgroups(suite=True) if n.startswith(f"bno-hvd-suite-{os.getpid()}-")]
    assert mine == [], mine  # removed when the job ended, not by the reaper later
    assert sorted(events["moved"]) == [0, 1, 2, 3], events  # each first worker was moved into its cgroup
    assert no_processes_left(events["moved"].values())
    assert wait_until_gone(before, suite=True) == before
