"""REAL slow ranks: cgroup CPU quotas. Where the machine lets us write cgroups (root and a cpu
controller) the multi-rank tests run real jobs whose ranks really get their share of a core, and
check that every cgroup is gone afterwards: after success, after a failing run, after a SIGKILL.
Elsewhere they skip with the machine's reason. The path logic for cgroup v2 (which this machine
does not have with a cpu controller) is checked on a directory laid out like one."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from support.cgroups import needs_cgroups, our_cgroups, wait_until_gone
from support.jobs import assert_ok, bno_cmd, horovodrun, mpirun

from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import RankSchedule
from bno_hvd.lab.cpuquota import CgroupPlace, CpuQuotaGroup, find_place, period_for
from bno_hvd.lab.heterogeneity import describe, label
from bno_hvd.processes.cpulimit import cpu_bandwidth, cpu_limit
from bno_hvd.training.results import steps_from_json

QUOTAS = "0.3,0.3,0.3,0.1"  # 1 core in all: the quotas, not the 2 cores, decide (also on a busy machine)


def test_period_fits_the_smallest_quota():
    assert period_for(RankSchedule.constant([0.5, 0.17])) == 10_000  # 1.7 ms of quota per 10 ms
    assert period_for(RankSchedule.constant([0.5, 0.05])) == 20_000  # 1 ms (the kernel's minimum) per 20 ms
    assert period_for(RankSchedule.constant([1, 1]), 25) == 25_000
    with pytest.raises(UsageError, match="too short for a quota of 0.05.*at least 20 ms"):
        period_for(RankSchedule.constant([0.5, 0.05]), 10)


def test_v1_and_v2_places_and_limits_on_a_laid_out_tree(tmp_path):
    # v1: our group is a child of the process's own cpu cgroup
    (tmp_path / "cpu" / "job7").mkdir(parents=True)
    place = find_place(mounts=f"cgroup {tmp_path}/cpu cgroup rw,cpu,cpuacct 0 0\n", own="3:cpu,cpuacct:/job7\n0::/\n")
    assert place == CgroupPlace(1, f"{tmp_path}/cpu/job7", f"{tmp_path}/cpu/job7")
    group = CpuQuotaGroup(place, "g", 10_000)
    os.mkdir(group.path)
    group.set_quota(0.17)
    assert (tmp_path / "cpu/job7/g/cpu.cfs_quota_us").read_text() == "1700"
    assert (tmp_path / "cpu/job7/g/cpu.cfs_period_us").read_text() == "10000"
    # v2: a sibling of the process's cgroup (v2 allows no processes beside children with controllers)
    (tmp_path / "v2" / "user.slice" / "session.scope").mkdir(parents=True)
    (tmp_path / "v2" / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    place = find_place(mounts=f"cgroup2 {tmp_path}/v2 cgroup2 rw 0 0\n", own="0::/user.slice/session.scope\n")
    assert place == CgroupPlace(2, f"{tmp_path}/v2/user.slice/session.scope", f"{tmp_path}/v2/user.slice")
    group = CpuQuotaGroup(place, "g", 20_000)
    os.mkdir(group.path)
    group.set_quota(0.25)
    assert (tmp_path / "v2/user.slice/g/cpu.max").read_text() == "5000 20000"
    # no cpu controller anywhere: one clear line
    with pytest.raises(UsageError, match="needs a cgroup cpu controller"):
        find_place(mounts=f"cgroup2 {tmp_path}/none cgroup2 rw 0 0\n", own="0::/\n")


def test_the_cpu_limit_is_the_smallest_on_the_way_to_the_root(tmp_path):
    # v1: a container's limit (0.5 of a core) above our own group's 0.17; the root has none (-1)
    for folder, quota in (("cpu", -1), ("cpu/pod", 50_000), ("cpu/pod/ours", 1_700)):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (tmp_path / folder / "cpu.cfs_period_us").write_text("100000\n" if quota != 1_700 else "10000\n")
    v1 = f"cgroup {tmp_path}/cpu cgroup rw,cpu,cpuacct 0 0\n"
    assert cpu_limit(mounts=v1, own="3:cpu,cpuacct:/pod/ours\n") == pytest.approx(0.17)
    assert cpu_limit(mounts=v1, own="3:cpu,cpuacct:/pod\n") == pytest.approx(0.5)
    assert cpu_limit(mounts=v1, own="3:cpu,cpuacct:/\n") is None  # no limit anywhere
    # with the smallest limit, its CFS period (how long one budget lasts)
    assert cpu_bandwidth(mounts=v1, own="3:cpu,cpuacct:/pod/ours\n") == pytest.approx((0.17, 0.01))
    assert cpu_bandwidth(mounts=v1, own="3:cpu,cpuacct:/pod\n") == pytest.approx((0.5, 0.1))
    # v2: "max" is no limit; a parent's 1.5 cores is above the child's 0.25
    (tmp_path / "v2" / "kube" / "c1").mkdir(parents=True)
    (tmp_path / "v2" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "v2" / "kube" / "cpu.max").write_text("150000 100000\n")
    (tmp_path / "v2" / "kube" / "c1" / "cpu.max").write_text("25000 100000\n")
    v2 = f"cgroup2 {tmp_path}/v2 cgroup2 rw 0 0\n"
    assert cpu_limit(mounts=v2, own="0::/kube/c1\n") == pytest.approx(0.25)
    (tmp_path / "v2" / "kube" / "c1" / "cpu.max").write_text("max 100000\n")
    assert cpu_limit(mounts=v2, own="0::/kube/c1\n") == pytest.approx(1.5)
    # nothing readable, or no cpu controller: None, never an error (it is read at every rebalance)
    assert cpu_limit(mounts=v2, own="0::/gone/away\n") is None
    assert cpu_limit(mounts="proc /proc proc rw 0 0\n", own="0::/\n") is None


RUN = [
    "train",
    "--dataset",
    "synthetic",
    "--strategy",
    "equal",
    "--base-batch-size",
    "32",
    "--no-eval",
    "--no-progress",
    "--latency-interval",
    "0",
    "--threads",
    "1",
]


def compute_cpu_shares(steps) -> list[float]:
    """Per update, the CPU a rank used while computing over the compute phase's wall time."""
    return [(s.cpu - s.cpu_sync) / s.compute for s in steps if s.compute > 0]


def update_cpu_shares(steps) -> list[float]:
    """Per update, the CPU a rank used over the update's wall time (what a quota caps)."""
    return [s.cpu / s.seconds for s in steps if s.seconds > 0]


def standard_error(values) -> float:
    return float(np.std(values, ddof=1) / math.sqrt(len(values)))


def compute_rate(steps) -> float:
    """A rank's samples per second of compute over ``steps``."""
    return sum(s.batch for s in steps) / sum(s.compute for s in steps)


def test_the_label_names_constant_quotas_and_counts_a_schedule():
    constant = describe(quotas=RankSchedule.constant([0.3, 0.3, 0.3, 0.1]), quota_period_us=10_000)
    assert label(constant) == "REAL: CPU-throttled ranks (cgroup quota): quotas 0.3,0.3,0.3,0.1 of a core, period 10 ms"
    changing = describe(quotas=RankSchedule(((0, (0.3,) * 4), (20, (0.3, 0.3, 0.3, 0.1)))), quota_period_us=10_000)
    assert (
        label(changing) == "REAL: CPU-throttled ranks (cgroup quota): schedule of 2 quota sets of a core, period 10 ms"
    )


@pytest.mark.mpi
@needs_cgroups
def test_compute_rates_follow_a_quota_schedule_and_the_cgroups_are_removed(tmp_path):
    # one job for both: every rank at 0.3 of a core for 20 updates, then rank 3 at 0.1 (1 core in
    # all: the quotas, not the 2 cores, decide, also on a busy machine)
    before = our_cgroups()
    schedule = tmp_path / "quotas.json"
    schedule.write_text(
        json.dumps([{"update": 0, "quotas": [0.3] * 4}, {"update": 20, "quotas": [0.3, 0.3, 0.3, 0.1]}])
    )
    args = ["--updates", "40", "--cpu-quota-schedule", str(schedule), "--log-dir", str(tmp_path / "log")]
    proc = horovodrun(4, bno_cmd(*RUN, *args), timeout=300)
    assert_ok(proc)
    assert wait_until_gone(before) == before
    run = json.loads((tmp_path / "log" / "run.json").read_text())
    assert run["label"].startswith("REAL: CPU-throttled ranks (cgroup quota): schedule of 2 quota sets")
    # --collectives auto (the default) chose Gloo, whose waits do not spin on the quotas, and said why
    assert (
        run["collectives"] == "gloo" and "--collectives auto: gloo (rank 0: ranks run under a CPU limit" in proc.stderr
    )
    steps = steps_from_json(json.loads((tmp_path / "log" / "ranks.json").read_text()))
    late = [r[25:] for r in steps]  # rank 3 at 0.1 of a core, the others at 0.3
    rates = [compute_rate(r) for r in late]
    ratio = rates[3] / (sum(rates[:3]) / 3)
    # per update, rank 3's compute rate over the others' mean: its noise is this run's own
    per_update = [
        (s3.batch / s3.compute) / np.mean([s.batch / s.compute for s in others])
        for s3, *others in zip(late[3], *late[:3])
    ]
    shares = [compute_cpu_shares(r) for r in late]
    print(
        f"compute samples/s per rank {[round(x) for x in rates]}, slow/fast {ratio:.2f}; "
        f"CPU share while computing {[round(float(np.mean(x)), 2) for x in shares]}"
    )
    # 0.1 vs 0.3 of a core: ~0.33; ~1 without quotas. Slower beyond the noise of its updates:
    assert 0 < ratio and np.mean(per_update) + 3 * standard_error(per_update) < 1
    # A quota caps a rank over whole CFS periods, so over its updates rank 3 stays under 0.1 of a
    # core (+ the noise of its own updates). While computing (waits left out: Gloo's sleep, MPI's
    # spin) the others, at 0.3, stay clear of rank 3 by more than the noise of both; a phase
    # shorter than a period may burst above its quota, so that share is compared, not capped.
    # Every margin comes from this run's measurements.
    whole = update_cpu_shares(late[3])
    assert np.mean(whole) < 0.1 + 3 * standard_error(whole)
    for r in range(3):
        assert np.mean(shares[r]) - np.mean(shares[3]) > 3 * math.hypot(
            standard_error(shares[r]), standard_error(shares[3])
        )
    # The schedule changed rank 3's quota during the run: its share while computing dropped by
    # more than the noise of both windows, and its compute per update grew (margins from this
    # run's measurements, not fixed ratios: a busy machine gives 0.3 less than 0.3).
    early = steps[3][5:20]
    share_before = compute_cpu_shares(early)
    noise = math.hypot(standard_error(share_before), standard_error(shares[3]))
    assert np.mean(share_before) - np.mean(shares[3]) > 3 * noise
    assert sum(s.compute for s in late[3]) / len(late[3]) > sum(s.compute for s in early) / len(early)


@pytest.mark.mpi
@needs_cgroups
@pytest.mark.parametrize("fault,code", [("nan-loss:1:6", 1), ("kill:2:8", None)])
def test_cgroups_are_removed_after_a_failure_and_a_kill(fault, code, tmp_path):
    before = our_cgroups()
    proc = mpirun(
        4,
        bno_cmd(*RUN, "--updates", "40", "--cpu-quota", QUOTAS, "--inject-fault", fault, "--num-workers", "1"),
        timeout=300,
    )
    assert proc.returncode != 0 if code is None else proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert wait_until_gone(before) == before  # the reaper removed the killed rank's group too


def run_python(script):
    """Run ``script`` in a fresh Python; returns the finished process and our cgroups before it."""
    before = our_cgroups()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc, before


@needs_cgroups
def test_a_rank_reads_the_limit_of_the_cgroup_it_runs_in(tmp_path):
    script = (
        "from bno_hvd.lab.cpuquota import CpuQuotaHook\n"
        "from bno_hvd.processes.cpulimit import cpu_limit\n"
        "from bno_hvd.common.parsing import RankSchedule\n"
        "outside = cpu_limit()\n"
        "hook = CpuQuotaHook(RankSchedule.constant([0.25]), 0)\n"
        "hook.start(None)\n"
        "inside = cpu_limit()\n"
        "hook.close()\n"
        "print(outside, inside, cpu_limit())\n"
    )
    proc, before = run_python(script)
    outside, inside, after = proc.stdout.split()
    assert float(inside) == pytest.approx(0.25) and outside == after  # back home: the old limit again
    assert wait_until_gone(before) == before


@pytest.mark.mpi
@needs_cgroups
def test_balanced_charges_the_starved_ranks_sync_and_gives_it_less_compute(tmp_path):
    # Every rank reports its cgroup's limit and its sync phase's CPU; rank 3 at 0.1 of a core pays
    # its ~4 ms of sync CPU ten times slower than a free core would, so balanced gives it far fewer
    # samples than the split that equalises compute alone (with MPI's spinning waits the work is
    # the least sync CPU of any rank, here rank 3's). That split is measured in the same run, from
    # the first interval, where every rank computes 32 samples: rank 3 would get ~1/10 of 128.
    # Usually rank 3 ends at 1 sample; on a busy machine it ended at 9 of a compute-only share of
    # 14, so the bound is that share less the noise of its per-update estimate in this run (3
    # standard errors), not a fixed count or fraction.
    run = [a if a != "equal" else "balanced" for a in RUN]
    proc = horovodrun(
        4,
        bno_cmd(*run, "--updates", "40", "--rebalance-every", "10", "--cpu-quota", QUOTAS, "--log-dir", str(tmp_path)),
        timeout=300,
    )
    assert_ok(proc)
    steps = steps_from_json(json.loads((tmp_path / "ranks.json").read_text()))
    last = [r[-1].batch for r in steps]
    first = [[s for s in r[:10] if s.batch == 32] for r in steps]
    assert all(len(r) >= 5 for r in first), "the first interval should run at the equal split"
    rates = [compute_rate(r) for r in first]
    compute_only = 128 * rates[3] / sum(rates)
    n = min(len(r) for r in first)  # per update: the share rank 3 would get from that update's rates
    shares = [128 * (1 / first[3][u].compute) / sum(1 / r[u].compute for r in first) for u in range(n)]
    noise = 3 * standard_error(shares)
    print(
        f"balanced under quotas {QUOTAS}: batch sizes at the end {last}; "
        f"compute alone: {compute_only:.1f} (3 standard errors {noise:.1f})"
    )
    assert 32 - compute_only > noise  # the quotas show in the measured rates (rank 3 is ~3x slower)
    assert sum(last) == 128 and last[3] < compute_only - noise


@needs_cgroups
def test_a_limit_counts_only_where_it_binds(tmp_path):
    # A rank that sleeps (a GPU rank waiting on its device) under a limit of 0.5 of a core does its
    # part of the allreduce at full speed: it reports no limit. The same rank computing reports it,
    # also where it then waits (asleep) in its sync phase for slower ranks most of each update, so
    # that it used less than half of its limit over the update (ranks that waited read none and
    # were fitted apart: four ranks at 0.2 of a core split 46 to 83 samples); and it keeps
    # reporting it when it waits again.
    script = (
        "import time\n"
        "from mpi4py import MPI\n"
        "from bno_hvd import Balancer\n"
        "from bno_hvd.allocation import make_strategy\n"
        "from bno_hvd.lab.cpuquota import CpuQuotaHook\n"
        "from bno_hvd.common.parsing import RankSchedule\n"
        "hook = CpuQuotaHook(RankSchedule.constant([0.5]), 0)\n"
        "hook.start(None)\n"
        "bal = Balancer(MPI.COMM_SELF, make_strategy('balanced', 1, 8), 1000, rebalance_every=1000)\n"
        "def steps(work, wait=0.0):\n"
        "    for _ in range(20):\n"
        "        bal.start_step()\n"
        "        work()\n"
        "        bal.end_compute()\n"
        "        time.sleep(wait)\n"
        "        bal.end_step()\n"
        "    return bal.report().cpu_limit\n"
        "def spin():\n"
        "    end = time.process_time() + 0.01\n"
        "    while time.process_time() < end: pass\n"
        "waiting = steps(lambda: time.sleep(0.01))\n"
        "computing = steps(spin, 0.06)\n"
        "cpu, wall = (sum(x) for x in zip(*bal.timer.cpu_use))\n"
        "used, took = (sum(x) for x in zip(*bal.timer.compute_use))\n"
        "from bno_hvd.processes.cpulimit import cpu_bandwidth\n"
        "seen = cpu_bandwidth()\n"
        "after = steps(lambda: time.sleep(0.01))\n"
        "hook.close()\n"
        "print(used / took, seen and seen[0], waiting, computing, cpu / wall, after)\n"
    )
    for _ in range(3):  # again while a busy machine held it under half of its limit computing (it cannot bind)
        proc, before = run_python(script)
        compute_use, seen, waiting, computing, whole, after = proc.stdout.split()[-6:]
        if float(compute_use) >= 0.25:  # it got at least half of its 0.5 while computing
            break
    assert waiting == "None" and float(whole) < 0.25  # computing, under half of its limit over the update
    assert computing != "None" and float(computing) == pytest.approx(0.5), (compute_use, seen)  # (which failed)
    # once it has bound, the same limit still counts while the rank waits (a starved rank given
    # a few samples waits for the others): only a changed limit is judged again
    assert float(after) == pytest.approx(0.5)
    assert wait_until_gone(before) == before


@needs_cgroups
def test_the_cpu_share_is_what_a_rank_got_of_the_time_it_could_run():
    # The kernel's run queue (schedstat): a rank throttled by a quota waits for the CPU most of
    # the time it could run; a rank that sleeps (an EMULATED slower device, a collective's wait)
    # is not runnable then, so it is not starved, though it uses as little CPU per second.
    script = (
        "import time\n"
        "from bno_hvd.common.parsing import RankSchedule\n"
        "from bno_hvd.lab.cpuquota import CpuQuotaHook\n"
        "from bno_hvd.library.timing import StepTimer\n"
        "def update(busy, sleep):\n"
        "    timer = StepTimer(window=4)\n"
        "    timer.start()\n"
        "    t = time.perf_counter()\n"
        "    while time.perf_counter() - t < busy:\n"
        "        pass\n"
        "    time.sleep(sleep)\n"
        "    timer.end_compute(8)\n"
        "    timer.end(update=0, batch_sizes=[8])\n"
        "    cpu, wall = timer.cpu_use[-1]\n"
        "    return timer.cpu_share(), cpu / wall\n"
        "free, sleeper = update(0.6, 0), update(0.05, 0.55)\n"
        "hook = CpuQuotaHook(RankSchedule.constant([0.1]), 0)\n"
        "hook.start(None)\n"
        "limited = update(0.6, 0)\n"
        "hook.close()\n"
        "print(*free, *sleeper, *limited)\n"
    )
    proc, before = run_python(script)
    free, free_per_wall, sleeper, sleeper_per_wall, limited, limited_per_wall = map(float, proc.stdout.split())
    assert limited < 0.5 * free and limited < 0.5 * sleeper  # ~0.1 against ~1 (~0.5 on a busy machine)
    assert sleeper_per_wall < limited_per_wall * 1.5  # per wall second it looked as starved as the throttled one
    assert wait_until_gone(before) == before
