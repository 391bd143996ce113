"""The paper's evaluation: per-block averages and time-to-accuracy (pure, hand-computed), then
``bno-hvd experiment`` end to end under a real horovodrun and ``bno-hvd report`` on its logs."""

import csv
import json
import math
import os
import shutil

import numpy as np
import pytest
from support.jobs import assert_ok, run_cli

from bno_hvd.lab.averages import (
    AVERAGE_COLUMNS,
    SUMMARY_COLUMNS,
    accuracy_at_samples,
    block_averages,
    csv_cell,
    merge_experiment,
    summary_row,
    time_to_accuracy,
    with_final_eval,
)
from bno_hvd.lab.benchstats import compute_balance, outside_compute_share
from bno_hvd.lab.heterogeneity import label_of_run as emulation_label
from bno_hvd.lab.logread import read_updates
from bno_hvd.lab.report import format_summary
from bno_hvd.training.results import UpdateRecord, steps_from_json

# the compute-balance gain under EMULATED speeds depends on speed: one test after another (tiers.py)
pytestmark = pytest.mark.alone

# five updates: times 1,2,3,4,5 s back to back (so `time` is the running sum), batches 10,10,20,20,20
RECORDS = [
    UpdateRecord(update=u, weight_update_time=float(u + 1), global_batch=b, time=t, batch_sizes=[b // 2, b // 2])
    for u, (b, t) in enumerate(zip([10, 10, 20, 20, 20], [1.0, 3.0, 6.0, 10.0, 15.0]))
]
EVALS = [
    {"update": 50, "samples": 500, "time": 10.0, "accuracy": 0.60},
    {"update": 100, "samples": 1000, "time": 20.0, "accuracy": 0.84},
    {"update": 150, "samples": 1500, "time": 30.0, "accuracy": 0.86},
]


# --- pure arithmetic ----------------------------------------------------------------------


def test_block_averages_by_hand():
    blocks = block_averages(RECORDS, 2)
    assert [(b.block, b.first_update, b.last_update, b.updates) for b in blocks] == [
        (1, 0, 1, 2),
        (2, 2, 3, 2),
        (3, 4, 4, 1),
    ]
    assert [b.mean_weight_update_time for b in blocks] == [1.5, 3.5, 5.0]
    # block 1 runs from 0 s (start of update 0) to 3 s; block 2 from 3 s to 10 s; block 3 10 -> 15 s
    assert [b.samples_per_s for b in blocks] == pytest.approx([20 / 3, 40 / 7, 20 / 5])
    assert [b.mean_global_batch for b in blocks] == [10, 20, 20]


def test_block_averages_one_block_and_every_update():
    (whole,) = block_averages(RECORDS, 100)
    assert whole.updates == 5 and whole.mean_weight_update_time == 3.0 and whole.samples_per_s == pytest.approx(80 / 15)
    assert [b.mean_weight_update_time for b in block_averages(RECORDS, 1)] == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError):
        block_averages(RECORDS, 0)


def test_time_to_accuracy_first_evaluation_at_or_above_target():
    hit = time_to_accuracy(EVALS, 0.85)
    assert (hit.time, hit.update, hit.samples, hit.accuracy) == (30.0, 150, 1500, 0.86)
    assert time_to_accuracy(EVALS, 0.84).time == 20.0  # reaching the target exactly counts
    assert time_to_accuracy(EVALS, 0.5).update == 50
    assert time_to_accuracy(EVALS, 0.9) is None
    assert time_to_accuracy([], 0.1) is None


def test_final_evaluation_is_added_once():
    result = {"updates": 170, "samples": 1700, "wall_seconds": 34.0, "test_accuracy": 0.87}
    assert with_final_eval(EVALS, result)[-1] == {"update": 170, "samples": 1700, "time": 34.0, "accuracy": 0.87}
    assert len(with_final_eval(EVALS, dict(result, updates=150))) == 3  # already evaluated there
    assert with_final_eval([], {"updates": 5}) == []  # --no-eval: nothing to add


def test_accuracy_after_a_number_of_samples():
    assert accuracy_at_samples(EVALS, 1000) == 0.84
    assert accuracy_at_samples(EVALS, 1499) == 0.84
    assert accuracy_at_samples(EVALS, 499) is None


def test_emulation_label_says_emulated():
    assert emulation_label({"emulation": None}).startswith("no emulation")
    label = emulation_label({"emulation": {"schedule": [[0, [1, 1, 1, 0.33]]], "rate": 300.0}})
    assert label == "EMULATED heterogeneity: speeds 1,1,1,0.33, 300 samples/s at speed 1"
    assert emulation_label({"emulation": {"schedule": [[0, [1, 1]], [9, [1, 0.5]]], "rate": 200}}).startswith(
        "EMULATED"
    )


def test_summary_row_by_hand():
    result = {"wall_seconds": 16.0, "test_accuracy": 0.86, "updates": 5, "samples": 80}
    row = summary_row("cnn", "equal", RECORDS, result, EVALS, 0.85, 2, "no emulation")
    assert set(row) == set(SUMMARY_COLUMNS)
    assert row["samples"] == 80 and row["updates"] == 5
    assert row["mean_weight_update_time_s"] == 3.0 and row["samples_per_s"] == 5.0
    assert (row["time_to_accuracy_s"], row["update_to_accuracy"], row["samples_to_accuracy"]) == (30.0, 150, 1500)
    assert row["final_batch_sizes"] == [10, 10] and row["status"] == "ok"
    missing = summary_row("cnn", "bno", RECORDS, None, [], 0.85, 2, "no emulation")
    assert missing["final_accuracy"] is None and missing["train_seconds"] == 15.0
    assert missing["status"] == "incomplete: stopped after 5 updates"
    assert missing["compute_balance"] is None and missing["outside_compute_share"] is None
    measured = dict(result, compute_balance=0.7, compute_balance_of_means=0.84, outside_compute_share=0.58)
    row = summary_row("cnn", "balanced", RECORDS, measured, EVALS, 0.85, 2, "REAL")
    assert (row["compute_balance"], row["compute_balance_of_means"], row["outside_compute_share"]) == (0.7, 0.84, 0.58)
    assert "0.70" in format_summary([row]) and "58%" in format_summary([row])
    failed = summary_row("resnet50", "random", [], None, [], None, 4, "no emulation")
    assert failed["status"] == "failed before its first update"
    assert failed["updates"] == 0 and failed["mean_weight_update_time_s"] is None and failed["samples_per_s"] is None


def test_csv_cells():
    assert [csv_cell(v) for v in (None, [3, 4], 0.1234567891, 7, "x")] == ["", "3;4", "0.123457", "7", "x"]


def test_a_matching_job_adds_its_runs_to_the_experiment():
    first = {
        "models": ["alexnet", "resnet50"],
        "strategies": ["bno", "equal"],
        "updates": 16,
        "average_every": 4,
        "eval_every": 0,
        "target_accuracy": None,
        "ranks": 4,
        "command": "job 1",
        "config": {"model": "alexnet", "strategy": "bno", "base_batch_size": 8},
    }
    second = dict(
        first,
        models=["vgg16", "alexnet"],
        strategies=["random"],
        command="job 2",
        config={"model": "vgg16", "strategy": "random", "base_batch_size": 8},
    )
    merged = merge_experiment(first, second)
    assert merged["models"] == ["alexnet", "resnet50", "vgg16"] and merged["strategies"] == ["bno", "equal", "random"]
    assert merged["commands"] == ["job 1", "job 2"] and "command" not in merged
    # other settings or other training flags: a new experiment, the old runs are no longer listed
    for changed in (dict(second, updates=32), dict(second, config={"model": "vgg16", "base_batch_size": 16})):
        fresh = merge_experiment(first, changed)
        assert fresh["models"] == ["vgg16", "alexnet"] and fresh["commands"] == ["job 2"]
    assert merge_experiment(None, first)["commands"] == ["job 1"]


# --- command-line checks, no MPI needed ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,needle",
    [
        (["--models", "cnn,lenet"], "--models"),
        (["--strategies", "equal,fastest"], "--strategies"),
        (["--updates", "10", "--average-every", "11"], "--average-every"),
        (["--no-eval", "--target-accuracy", "0.8"], "--target-accuracy"),
        (["--target-accuracy", "85"], "--target-accuracy"),
        (["--no-eval", "--eval-every", "5"], "--eval-every"),
    ],
)
def test_experiment_flag_errors_are_one_line(args, needle, tmp_path):
    proc = run_cli("experiment", "--out", str(tmp_path / "x"), *args)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_report_on_bad_logdir_is_one_line(tmp_path):
    for target in (tmp_path / "missing", tmp_path):  # no such directory; a directory without runs
        proc = run_cli("report", str(target))
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    run = tmp_path / "runs" / "cnn" / "equal"
    run.mkdir(parents=True)
    (run / "updates.jsonl").write_text(json.dumps(RECORDS[0].to_dict()) + "\n")
    (run / "run.json").write_text("{not json")
    proc = run_cli("report", str(tmp_path))
    assert proc.returncode == 2 and "run.json" in proc.stderr and "Traceback" not in proc.stderr


# --- end to end under horovodrun ----------------------------------------------------------

OUTPUTS = ("averages.csv", "summary.csv", "summary.json", "fig_cnn.png", "summary.png", "accuracy_cnn.png")


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.mpi
def test_experiment_writes_csv_json_and_pngs(tiny_experiment):
    out, proc = tiny_experiment
    for name in OUTPUTS:
        assert (out / name).stat().st_size > 0, name
    for name in ("fig_cnn.png", "summary.png", "accuracy_cnn.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for strategy in ("equal", "balanced"):
        for log in ("run.json", "updates.jsonl", "result.json", "ranks.json"):
            assert (out / "runs" / "cnn" / strategy / log).exists()
    rows = read_csv(out / "averages.csv")
    assert tuple(rows[0]) == AVERAGE_COLUMNS
    assert [(r["strategy"], int(r["block"]), int(r["first_update"]), int(r["updates"])) for r in rows] == [
        (s, k + 1, 5 * k, 5) for s in ("equal", "balanced") for k in range(4)
    ]
    for r in rows:
        for col in ("mean_weight_update_time_s", "samples_per_s", "mean_global_batch"):
            assert math.isfinite(float(r[col])) and float(r[col]) > 0, (col, r)
        assert float(r["mean_global_batch"]) == 32  # both keep the global batch at N*B
        assert r["emulation"].startswith("EMULATED")
    assert proc.stdout.count("test accuracy") == 2  # one line per run, rank 0 only


@pytest.mark.mpi
def test_experiment_summary_accuracy_and_balance(tiny_experiment):
    out, _ = tiny_experiment
    summary = json.loads((out / "summary.json").read_text())
    runs = {r["strategy"]: r for r in summary["runs"]}
    assert set(runs) == {"equal", "balanced"} and summary["target_accuracy"] == 0.2
    for r in runs.values():
        assert r["status"] == "ok" and r["updates"] == 20 and r["samples"] == 640
        assert 0 <= r["final_accuracy"] <= 1
        assert [e["update"] for e in r["evals"]] == [10, 20]
        assert r["evals"][-1]["accuracy"] == r["final_accuracy"]
        # the last evaluation is at the last update: the clock can only have moved by less than an update since
        longest = max(u.weight_update_time for u in read_updates(str(out / "runs" / "cnn" / r["strategy"])))
        assert 0 < r["evals"][0]["time"] < r["evals"][1]["time"] == pytest.approx(r["train_seconds"], abs=longest)
        hit = next((e for e in r["evals"] if e["accuracy"] >= 0.2), None)
        assert r["time_to_accuracy_s"] == (hit["time"] if hit else None)
    # the two figures beside samples/s, as bench computes them from the run's own logs
    rank_steps = {n: steps_from_json(json.loads((out / "runs" / "cnn" / n / "ranks.json").read_text())) for n in runs}
    for name, r in runs.items():
        path, steps = str(out / "runs" / "cnn" / name), rank_steps[name]
        assert r["compute_balance"] == pytest.approx(compute_balance(steps))
        assert r["outside_compute_share"] == pytest.approx(outside_compute_share(read_updates(path), steps))
        assert 0 < r["compute_balance"] <= 1 and 0 <= r["outside_compute_share"] < 1
    # emulated speeds 1,0.5: the even split leaves rank 0 idle half the time, balanced does not.
    # After the first interval (5 updates at the even split in both runs), balanced's per-update
    # compute balance is above equal's by more than the noise of both (margins from this run).
    # Updates in which a rank sits out are left out: on a machine whose other load falls on one
    # rank's core, that rank gets half the others' CPU and is tried out for an interval (seen in
    # a fresh-clone run: 21,11 then 32,0 at update 15); that interval measures, it does not split.
    per_update = {}
    for name, steps in rank_steps.items():
        everyone = (np.array([[s.batch for s in r[5:]] for r in steps]) > 0).all(axis=0)
        assert everyone.sum() >= 5, everyone  # at most one interval of the three is a trial
        compute = np.array([[s.compute for s in r[5:]] for r in steps])[:, everyone]
        per_update[name] = compute.mean(axis=0) / compute.max(axis=0)
    gain = per_update["balanced"].mean() - per_update["equal"].mean()
    noise = math.hypot(*(v.std(ddof=1) / math.sqrt(v.size) for v in per_update.values()))
    assert gain > 3 * noise, (gain, noise)
    # same samples, sample-weighted gradients: the split does not change what the model learns
    assert abs(runs["equal"]["final_accuracy"] - runs["balanced"]["final_accuracy"]) <= 0.02
    # the emulated speed-1 rank ends with the larger share of the global batch
    b0, b1 = runs["balanced"]["final_batch_sizes"]
    assert b0 + b1 == 32 and b0 > b1
    assert runs["equal"]["final_batch_sizes"] == [16, 16]


@pytest.mark.mpi
def test_report_redraws_the_same_tables(tiny_experiment, tmp_path):
    out, _ = tiny_experiment
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    originals = {n: (copy / n).read_text() for n in ("averages.csv", "summary.csv")}
    for name in OUTPUTS:
        os.remove(copy / name)
    proc = run_cli("report", str(copy))
    assert_ok(proc)
    for name in OUTPUTS:
        assert (copy / name).exists(), name
    assert (copy / "fig_cnn.png").read_bytes()[:4] == b"\x89PNG"
    for name, text in originals.items():
        assert (copy / name).read_text() == text, name
    assert "EMULATED" in proc.stdout
    # other block size and target from the command line
    assert_ok(run_cli("report", str(copy), "--average-every", "10", "--target-accuracy", "0.99"))
    rows = read_csv(copy / "averages.csv")
    assert [int(r["updates"]) for r in rows] == [10, 10, 10, 10]
    assert all(r["time_to_accuracy_s"] == "" for r in read_csv(copy / "summary.csv"))
