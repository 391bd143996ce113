"""Time to a target accuracy, MLPerf-style: the trimmed mean, the speed-ups and the table by hand
(pure), then ``bno-hvd time-to-accuracy`` end to end on 2 ranks under real CPU quotas."""

import json
import re

import pytest
from support.cgroups import needs_cgroups, our_cgroups, wait_until_gone
from support.jobs import assert_ok, bno_cmd, horovodrun, run_cli

from bno_hvd.lab.ttastats import (
    markdown_report,
    markdown_table,
    mlperf_mean,
    split_by_limits,
    summarize,
    trimmed_indices,
)


def run(t, acc=0.86, updates=300, at=None):
    return {"time_to_target_s": t, "final_accuracy": acc, "updates": updates, "update_at_target": at or updates}


# --- pure arithmetic ----------------------------------------------------------------------


def test_mlperf_mean_leaves_out_the_fastest_and_the_slowest():
    assert mlperf_mean([50.0, 10.0, 20.0, 30.0, 40.0]) == 30.0  # (20 + 30 + 40) / 3
    assert mlperf_mean([1.0, 2.0, 9.0]) == 2.0
    assert mlperf_mean([5.0, 5.0, 5.0, 5.0]) == 5.0
    assert trimmed_indices([50.0, 10.0, 20.0, 30.0, 40.0]) == (1, 0)
    assert trimmed_indices([5.0, 5.0, 5.0]) == (0, 1)  # ties: the first is the fastest, the next the slowest


def test_a_run_that_never_reached_the_target_is_the_slowest():
    assert mlperf_mean([10.0, None, 20.0, 30.0, 40.0]) == 30.0  # the miss is left out, then 10: (20+30+40)/3
    assert trimmed_indices([10.0, None, 20.0, 30.0, 40.0]) == (0, 1)
    assert mlperf_mean([10.0, None, 20.0, None, 40.0]) is None  # two misses: the second stays in, no score
    assert trimmed_indices([None, None, None]) == (0, 1)


def test_fewer_than_three_runs_are_averaged_whole():
    assert mlperf_mean([10.0, 20.0]) == 15.0 and trimmed_indices([10.0, 20.0]) is None
    assert mlperf_mean([10.0, None]) is None
    assert mlperf_mean([]) is None


def test_summary_speed_up_over_equal():
    runs = {
        "equal": [run(t) for t in (60.0, 66.0, 63.0, 90.0, 30.0)],  # mean (60 + 66 + 63) / 3 = 63
        "balanced": [run(t) for t in (21.0, None, 20.0, 22.0, 5.0)],  # mean (20 + 21 + 22) / 3 = 21
        "bno": [run(t) for t in (None, None, 20.0, 22.0, 5.0)],
    }
    table = summarize(runs)
    assert list(table) == ["equal", "balanced", "bno"]
    assert table["equal"] == {
        "runs": 5,
        "reached": 5,
        "mlperf_mean_s": 63.0,
        "x_equal": 1.0,
        "median_updates_to_target": 300,
        "left_out": [4, 3],
    }
    assert table["balanced"] == {
        "runs": 5,
        "reached": 4,
        "mlperf_mean_s": 21.0,
        "x_equal": 3.0,
        "median_updates_to_target": 300,
        "left_out": [4, 1],
    }
    assert table["bno"]["mlperf_mean_s"] is None and table["bno"]["x_equal"] is None and table["bno"]["reached"] == 3
    assert summarize(runs, "balanced")["equal"]["x_balanced"] == pytest.approx(21 / 63)


def test_the_fixed_split_follows_the_limits():
    assert split_by_limits([0.45, 0.45, 0.45, 0.15], 128) == [39, 38, 38, 13]
    assert split_by_limits([0.3, 0.1], 32) == [24, 8]
    assert sum(split_by_limits([0.4, 0.35, 0.25, 0.01], 64)) == 64 and min(split_by_limits([0.4, 0.01], 64)) >= 1


def test_markdown_table_lists_every_run_and_marks_the_left_out():
    runs = {
        "equal": [run(60.0, at=250), run(66.0, 0.851, at=300), run(63.0, at=250)],
        "balanced": [run(21.0, at=250), run(None, 0.842, 400), run(20.0, at=300)],  # median of 250, 300
    }
    lines = markdown_table(summarize(runs), runs, 0.85).splitlines()
    assert lines[0].startswith("| strategy | time to 85% (s, mean without fastest and slowest) | x equal | reached |")
    assert lines[2] == "| equal | 63.0 | 1.00 | 3/3 | 250 | 60.0 (0.860)*, 66.0 (0.851)*, 63.0 (0.860) |"
    assert lines[3] == (
        "| balanced | 21.0 | 3.00 | 2/3 | 275 | 21.0 (0.860), not reached (0.842 after 400 updates)*, 20.0 (0.860)* |"
    )
    runs["balanced"][0] = run(None, 0.8)
    assert "| balanced | not reached | - | 1/3 |" in markdown_table(summarize(runs), runs, 0.85)


def test_markdown_report_says_what_when_and_how():
    runs = {"equal": [run(10.0)]}
    meta = {
        "target_accuracy": 0.88,
        "label": "REAL: quotas 0.3,0.1",
        "ranks": 2,
        "rounds": 1,
        "warmup": 5,
        "updates": 40,
        "eval_every": 10,
        "date": "2026-11-26 12:00 UTC",
        "commit": "abc1234",
        "command": "bno-hvd time-to-accuracy --out x",
    }
    text = markdown_report({"meta": meta, "runs": runs, "summary": summarize(runs), "baseline": "equal"})
    assert text.startswith("Time to 88% test accuracy: REAL: quotas 0.3,0.1; 2 ranks, 1 rounds")
    assert "Measured 2026-11-26 12:00 UTC on commit abc1234: `bno-hvd time-to-accuracy --out x`" in text
    assert "| equal | 10.0 | 1.00 | 1/1 | 300 | 10.0 (0.860) |" in text


# --- the command --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, needle",
    [
        (["--target-accuracy", "1.5"], "--target-accuracy 1.5 must be a fraction"),
        (["--eval-every", "0"], "--eval-every 0 must be between 1 and --updates"),
        (["--strategies", "equal,fixed"], "'fixed' needs its split"),
        (["--strategies", "equal,equal"], "names equal more than once"),
        (["--rounds", "0"], "--rounds 0 must be >= 1"),
    ],
)
def test_flag_errors_are_one_line(args, needle, tmp_path):
    proc = run_cli("time-to-accuracy", *args, "--out", str(tmp_path))
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


TINY = [
    "--strategies",
    "equal,balanced,fixed",
    "--cpu-quota",
    "0.6,0.2",  # 0.8 of a core in all, of 2: the quotas, not the machine, decide
    "--base-batch-size",
    "16",
    "--rebalance-every",
    "5",
    "--updates",
    "20",
    "--eval-every",
    "10",
    "--target-accuracy",
    "0.5",
    "--rounds",
    "2",
    "--warmup",
    "3",
    "--latency-interval",
    "1",
]


@pytest.mark.mpi
@pytest.mark.root
@needs_cgroups
def test_two_tiny_rounds_on_two_ranks(tmp_path, fashion_available):
    before = our_cgroups()
    proc = horovodrun(2, bno_cmd("time-to-accuracy", *TINY, "--out", str(tmp_path)), timeout=600)
    assert_ok(proc)
    assert wait_until_gone(before) == before  # every run's cgroups removed
    data = json.loads((tmp_path / "time-to-accuracy.json").read_text())
    meta, runs, summary = data["meta"], data["runs"], data["summary"]
    assert meta["label"].startswith("REAL") and meta["batch_sizes_fixed"] == [24, 8] and meta["ranks"] == 2
    # every round runs each strategy once, in the order drawn for it
    assert sorted(map(sorted, data["orders"])) == [["balanced", "equal", "fixed"]] * 2
    for name, rs in runs.items():
        assert [(r["round"], r["seed"]) for r in rs] == [(1, 0), (2, 1)]
        assert [data["orders"][r["round"] - 1][r["position"] - 1] for r in rs] == [name, name]
        for r in rs:
            # evaluations every 10 updates until the first at or above the target, or the budget
            updates = [e["update"] for e in r["evals"]]
            assert updates == list(range(10, r["updates"] + 1, 10)) and r["updates"] <= 20
            hits = [e for e in r["evals"] if e["accuracy"] >= 0.5]
            assert r["time_to_target_s"] == (hits[0]["time"] if hits else None)
            assert r["final_accuracy"] == r["evals"][-1]["accuracy"]
            assert hits == r["evals"][-1:] or (not hits and r["updates"] == 20)  # it stopped at the target
            times = [e["time"] for e in r["evals"]]
            assert times == sorted(times) and times[0] > 0
        if name == "fixed":
            assert all(r["final_batch_sizes"] == [24, 8] for r in rs)
        # the reported mean is the mean of the listed runs (two: no trimming), None if one missed
        times = [r["time_to_target_s"] for r in rs]
        if None in times:
            assert summary[name]["mlperf_mean_s"] is None
        else:
            assert summary[name]["mlperf_mean_s"] == pytest.approx(sum(times) / 2)
        assert summary[name]["reached"] == sum(t is not None for t in times)
    # the table on stdout: one row per strategy, the same numbers
    table = (tmp_path / "time-to-accuracy.md").read_text()
    assert table in re.sub(r"(?m)^\[\d+,0\]<stdout>:", "", proc.stdout)  # horovodrun tags rank 0's lines
    for name, row in summary.items():
        (line,) = [x for x in table.splitlines() if x.startswith(f"| {name} |")]
        mean = "not reached" if row["mlperf_mean_s"] is None else f"{row['mlperf_mean_s']:.1f}"
        assert line.startswith(f"| {name} | {mean} |") and len(re.findall(r"\(\d\.\d{3}", line)) == 2
    assert (tmp_path / "time-to-accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "runs" / "round-2" / "fixed" / "updates.jsonl").exists()
    # --redraw: the same table from the JSON alone, no MPI
    (tmp_path / "time-to-accuracy.png").unlink()
    again = run_cli("time-to-accuracy", "--redraw", "--out", str(tmp_path))
    assert again.returncode == 0 and again.stdout == table and (tmp_path / "time-to-accuracy.png").exists()
