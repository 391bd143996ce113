"""bench --rounds and --suite with real 4-rank jobs: structure, pairing, clean-up (never speed)."""

import json

import pytest
from support.cgroups import needs_cgroups, our_cgroups, wait_until_gone
from support.jobs import assert_ok, bno_cmd, horovodrun, run_cli

from bno_hvd.lab.confine import entry_for
from bno_hvd.lab.pairing import round_orders
from bno_hvd.lab.profiles import BY_NAME, PROFILES, bench_args, hand_split, scaled_schedule
from bno_hvd.training.results import steps_from_json

NAMES = ["equal", "balanced", "balanced:sit_out=0", "fixed"]  # with an ablation


def read_updates(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.mpi
@needs_cgroups
def test_rounds_interleave_the_strategies_and_pair_them_per_round(tmp_path):
    before = our_cgroups()
    out = tmp_path / "bench"
    # 2 untimed updates, then 2 rounds of a block of 4 updates per strategy (2 rounds show the
    # per-round orders and pairing as well as more would)
    args = ["bench", "--dataset", "synthetic", "--updates", "10", "--warmup", "2", "--rounds", "2"]
    args += ["--rebalance-every", "4", "--strategies", ",".join(NAMES), "--batch-sizes", "40,40,40,8"]
    args += ["--cpu-quota", "0.45,0.45,0.45,0.15", "--no-progress", "--out", str(out)]
    proc = horovodrun(4, bno_cmd(*args), timeout=400)
    assert_ok(proc)
    assert wait_until_gone(before) == before  # one cgroup per run and rank, all removed
    # the order of every round, drawn by rank 0 from --seed (0)
    orders = [line.split(": ", 1)[1].split(", ") for line in proc.stderr.splitlines() if "== round " in line]
    assert orders == round_orders(NAMES, 2, 0)
    assert "paired per round (2 rounds" in proc.stdout and "x equal (median [95% CI])" in proc.stdout
    rows = {r["strategy"]: r for r in json.loads((out / "bench.json").read_text())}
    equal = rows["equal"]["paired"]["rates"]
    for name, row in rows.items():
        paired = row["paired"]
        assert len(paired["rates"]) == 2 and all(r > 0 for r in paired["rates"])
        assert paired["ratios"] == pytest.approx([r / e for r, e in zip(paired["rates"], equal)])
        assert paired["low"] <= paired["median"] <= paired["high"]
        assert row["emulation"].startswith("REAL: CPU-throttled ranks")
        updates = read_updates(out / "runs" / name / "updates.jsonl")
        assert [u["update"] for u in updates] == list(range(10))
        # a block's rate: its samples over its update times, which never hold another strategy's block
        starts = [2 + 4 * k for k in range(2)]
        for k, first in enumerate(starts):
            block = updates[first : first + 4]
            rate = sum(u["global_batch"] for u in block) / sum(u["weight_update_time"] for u in block)
            assert rate == pytest.approx(paired["rates"][k], rel=1e-6)
        others = sum(
            sum(u["weight_update_time"] for u in read_updates(out / "runs" / o / "updates.jsonl")[2:6])
            for o in NAMES
            if o != name
        )
        assert max(u["weight_update_time"] for u in updates[2:]) < others
        steps = steps_from_json(json.loads((out / "runs" / name / "ranks.json").read_text()))
        assert max(s.gap for r in steps for s in r[2:]) < others  # nor do the fits' gaps
    assert rows["fixed"]["final_batch_sizes"] == [40, 40, 40, 8]


@pytest.mark.slow
def test_rounds_need_blocks_of_two_updates():
    proc = run_cli("bench", "--updates", "10", "--warmup", "4", "--rounds", "4")
    assert proc.returncode == 2 and "each round needs a block of at least 2 updates" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_the_suite_runs_outside_mpirun_and_needs_an_output_directory(tmp_path):
    proc = run_cli("bench", "--suite", "real")
    assert proc.returncode == 2 and "--suite needs --out DIR" in proc.stderr
    proc = run_cli("bench", "--suite", "real", "--out", str(tmp_path), env={"OMPI_COMM_WORLD_SIZE": "4"})
    assert proc.returncode == 2 and "without mpirun" in proc.stderr
    proc = run_cli("bench", "--suite", "real", "--profiles", "nope", "--out", str(tmp_path))
    assert proc.returncode == 2 and "unknown ['nope']" in proc.stderr


def test_hand_splits_follow_what_a_user_knows_of_the_ranks():
    assert hand_split(BY_NAME["outside-100ms"]) == [39, 38, 38, 13]  # 128 x quota / sum: 38.4 x3, 12.8
    assert hand_split(BY_NAME["outside-equal-10ms"]) == [32, 32, 32, 32]
    assert sum(hand_split(BY_NAME["emulated-4-levels"])) == 128
    eight = BY_NAME["outside-8-four-tiny-50ms"]  # 8 ranks: 8 x bench's base batch of 32
    assert eight.ranks == 8 and hand_split(eight) == [56] * 4 + [8] * 4 and eight not in PROFILES
    assert entry_for("a,-,c", 1) is None and entry_for("a,-,c", 2) == "c" and entry_for("", 0) is None


def test_a_quota_schedule_keeps_its_place_among_the_timed_updates(tmp_path):
    # written for 100 updates with 20 of warm-up (4 rounds of 20): rank 3 is slow in rounds 2-3;
    # 180 updates (8 rounds of 20): in rounds 3-6, the same half, each change on a block's start
    profile = BY_NAME["quota-schedule"]
    assert [u for u, _ in scaled_schedule(profile, 100, 20)] == [0, 40, 80]
    changes = [u for u, _ in scaled_schedule(profile, 180, 20)]
    assert changes == [0, 60, 140] and all((u - 20) % 20 == 0 for u in changes[1:])
    assert [u for u, _ in scaled_schedule(BY_NAME["quota-tiny-lifted"], 180, 20)] == [0, 100]
    args = bench_args(profile, str(tmp_path), 8, 180, 20, ["equal", "balanced"])
    written = json.loads((tmp_path / "quota-schedule.json").read_text())
    assert args[args.index("--cpu-quota-schedule") + 1] == str(tmp_path / "quota-schedule.json")
    assert [(e["update"], e["quotas"][3]) for e in written] == [(0, 0.45), (60, 0.12), (140, 0.45)]


@pytest.mark.mpi
@needs_cgroups
def test_a_profile_with_limits_set_outside(tmp_path):
    # ranks started inside cgroups made by the suite, as a container would: every rank reads its
    # limit at the start, and nothing is left behind
    before = our_cgroups(suite=True)
    args = ["bench", "--suite", "real", "--profiles", "outside-levels-10ms", "--strategies", "equal,fixed"]
    # all runs alive at once (--rounds 2): the slowest rank's start-up (0.12 of a core) is paid once, not per run
    proc = run_cli(*args, "--updates", "6", "--warmup", "2", "--rounds", "2", "--out", str(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert wait_until_gone(before, suite=True) == before
    suite = json.loads((tmp_path / "suite.json").read_text())
    assert [r["profile"] for r in suite] == ["outside-levels-10ms"] and suite[0]["label"].startswith("REAL")
    assert suite[0]["strategies"]["fixed"]["final_batch_sizes"] == hand_split(BY_NAME["outside-levels-10ms"])
    assert "| outside-levels-10ms (REAL) |" in (tmp_path / "suite.md").read_text()
    rows = read_updates(tmp_path / "outside-levels-10ms" / "runs" / "equal" / "updates.jsonl")
    assert len(rows) == 6
    # bno-hvd did not set these limits; the ranks read them from their cgroups, and say so
    bench = json.loads((tmp_path / "outside-levels-10ms" / "bench.json").read_text())
    label = "REAL: CPU limits set outside bno-hvd (read from each rank's cgroup): 0.45,0.35,0.25,0.12 of a core"
    assert bench[0]["emulation"] == label
    run = json.loads((tmp_path / "outside-levels-10ms" / "runs" / "fixed" / "run.json").read_text())
    assert run["cpu_limits_outside"] == pytest.approx([0.45, 0.35, 0.25, 0.12])
