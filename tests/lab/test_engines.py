"""The engines' side-by-side table (bno_hvd/lab/engines.py): ratios from suite directories."""

import json

import pytest

from bno_hvd.lab.engines import engine_markdown, engine_rows, main, read_suite


def write_suite(root, numbers):
    for profile, rows in numbers.items():
        (root / profile).mkdir(parents=True)
        bench = [{"strategy": s, "samples_per_s": v} for s, v in rows.items()]
        (root / profile / "bench.json").write_text(json.dumps(bench))
    return str(root)


def test_ratios_per_round_their_median_and_lowest(tmp_path, capsys):
    h1 = write_suite(tmp_path / "h1", {"a": {"equal": 100.0, "balanced": 200.0}, "b": {"equal": 50.0}})
    t1 = write_suite(tmp_path / "t1", {"a": {"equal": 90.0, "balanced": 210.0}, "b": {"equal": 50.0}})
    h2 = write_suite(tmp_path / "h2", {"a": {"equal": 100.0, "balanced": 200.0}})  # b failed in round 2
    t2 = write_suite(tmp_path / "t2", {"a": {"equal": 110.0, "balanced": 180.0}})
    h3 = write_suite(tmp_path / "h3", {"a": {"equal": 80.0, "balanced": 100.0}})
    t3 = write_suite(tmp_path / "t3", {"a": {"equal": 100.0, "balanced": 100.0}})
    rows = engine_rows([read_suite(d) for d in (h1, h2, h3)], [read_suite(d) for d in (t1, t2, t3)])
    assert [(r["profile"], r["strategy"]) for r in rows] == [("a", "balanced"), ("a", "equal")]
    balanced, equal = rows
    assert balanced["ratio"] == pytest.approx(1.0) and balanced["lowest"] == pytest.approx(0.9)
    assert equal["ratio"] == pytest.approx(1.1) and equal["lowest"] == pytest.approx(0.9)
    assert equal["horovod"] == 100.0 and equal["torch"] == 100.0 and equal["rounds"] == 3
    main([f"{h1},{h2},{h3}", f"{t1},{t2},{t3}"])
    assert capsys.readouterr().out == engine_markdown(rows)
    assert "| a | equal | 100.0 | 100.0 | 1.100 | 0.900 |" in engine_markdown(rows)


def test_rounds_must_pair_up():
    with pytest.raises(ValueError, match="one pair per round"):
        engine_rows([{}], [])
