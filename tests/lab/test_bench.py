"""A short real multi-rank bench run: checks the output's structure (never its speed). Two ranks,
one emulated 2x slower: the structure (a move of the split, a rank that waits) needs no more."""

import csv
import dataclasses
import json

import pytest
from support.checks import PNG_MAGIC, assert_png_drawing
from support.jobs import assert_ok, bno_cmd, horovodrun, run_cli

from bno_hvd.lab.logread import read_steps
from bno_hvd.lab.stalls import find_stalls, format_stalls
from bno_hvd.training.results import UpdateRecord

pytestmark = pytest.mark.mpi


def test_bench_writes_table_json_csv_png(tmp_path):
    out = tmp_path / "bench"
    proc = horovodrun(
        2,
        bno_cmd(
            "bench",
            "--dataset",
            "synthetic",
            "--updates",
            "10",
            "--warmup",
            "2",
            "--rebalance-every",
            "4",
            "--strategies",
            "equal,balanced,bno,fixed",
            "--batch-sizes",
            "9,5",
            "--emulate-speed",
            "1,0.5",
            "--emulate-rate",
            "2000",
            "--base-batch-size",
            "8",
            "--latency-interval",
            "1",
            "--no-progress",
            "--out",
            str(out),
            "--tensorboard",
            str(tmp_path / "tb"),
        ),
        timeout=400,
    )
    assert_ok(proc)
    assert "EMULATED heterogeneity: speeds 1,0.5" in proc.stdout
    records = json.loads((out / "bench.json").read_text())
    assert [r["strategy"] for r in records] == ["equal", "balanced", "bno", "fixed"]
    assert records[3]["final_batch_sizes"] == [9, 5]  # --batch-sizes went to 'fixed' only
    assert records[0]["final_batch_sizes"] == [8, 8]
    for r in records:
        for key in ("samples_per_s", "speedup_vs_equal", "fraction_of_ideal", "control_overhead"):
            assert isinstance(r[key], float) and r[key] == r[key], (key, r)
        assert r["samples_per_s"] > 0 and 0 < r["fraction_of_ideal"] and 0 <= r["control_overhead"] < 1
        assert r["emulation"].startswith("EMULATED")
        # the allreduce alone, measured at the start of each run on every rank: wall and CPU > 0
        assert 0 < r["allreduce_alone"] < r["mean_weight_update_time"] * 50, r
        assert len(r["rank_breakdown"]) == 2 and all(b["cpu_alone"] > 0 for b in r["rank_breakdown"]), r
    assert records[0]["speedup_vs_equal"] == 1.0
    # every change of the split, and every decision with a note, as the run's own log shows them
    # (equal and fixed never move)
    assert records[0]["moves"] == [] == records[3]["moves"] and "  equal: none" in proc.stdout
    for i, name in enumerate(["equal", "balanced", "bno"]):
        logged = [json.loads(line) for line in (out / "runs" / name / "updates.jsonl").read_text().splitlines()]
        pairs = zip(logged, logged[1:])
        changed = [
            (b["update"], b["batch_sizes"])
            for a, b in pairs
            if a["batch_sizes"] != b["batch_sizes"] or a.get("rebalance_note")
        ]
        assert [(m["update"], m["sizes"]) for m in records[i]["moves"]] == changed
        if name == "bno":  # the paper's formula moves at every rebalance
            assert changed and f"update {changed[0][0]:>6}: {','.join(map(str, changed[0][1]))}" in proc.stdout
    # the stalls of the timed updates, as the run's own logs give them (lab/stalls.py), one line each
    for r in records:
        run = out / "runs" / r["strategy"]
        logged = [UpdateRecord.from_dict(json.loads(line)) for line in (run / "updates.jsonl").read_text().splitlines()]
        steps, _ = read_steps(str(run / "ranks.json"))
        assert r["stalls"] == [dataclasses.asdict(x) for x in find_stalls(logged, steps, warmup=2)]
        assert f"  {r['strategy']}: {format_stalls(find_stalls(logged, steps, warmup=2))}" in proc.stdout
    rows = list(csv.DictReader((out / "bench.csv").open()))
    assert [r["strategy"] for r in rows] == ["equal", "balanced", "bno", "fixed"]
    assert (out / "bench.png").read_bytes()[:8] == PNG_MAGIC
    for name in ("equal", "balanced", "bno"):
        lines = (out / "runs" / name / "updates.jsonl").read_text().splitlines()
        assert len(lines) == 10
        # the per-rank timeline of compute (blue) and waiting (orange; rank 1 is emulated 2x slower)
        assert_png_drawing(out / f"stragglers_{name}.png", colours=((0.122, 0.467, 0.706), (1.0, 0.498, 0.055)))
        assert len(list((tmp_path / "tb" / name).glob("events.out.tfevents.*"))) == 1  # one directory per run


def test_bench_rejects_unknown_strategy():
    proc = run_cli("bench", "--strategies", "equal,fastest", "--dataset", "synthetic")
    assert proc.returncode == 2
    assert "bno-hvd: error: --strategies 'equal,fastest': unknown strategy 'fastest'" in proc.stderr
    assert "Traceback" not in proc.stderr
