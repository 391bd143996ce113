"""The suite's tables from profile rows: balanced against its peers (never its own variants), and
the ablation table of balanced's variants, paired per round."""

import json
import pathlib
import shutil

import numpy as np
import pytest

from bno_hvd.lab.pairing import comparison
from bno_hvd.lab.profiles import retable
from bno_hvd.lab.suitetable import ablation_markdown, geometric_mean, suite_markdown


def row(name, rates):
    table = comparison(rates, "equal")
    strategies = {
        n: {
            "vs_equal": [t["median"], t["low"], t["high"]],
            "vs_best_other": t["vs_best_peer"],
            "vs_top_peer": t["vs_top_peer"],
            "top_peer": t["top_peer"],
            "of_ideal": 0.5,
            "rates": t["rates"],
        }
        for n, t in table.items()
    }
    return {"profile": name, "label": "REAL: x", "strategies": strategies}


RATES = {
    "equal": [100.0, 110.0, 90.0, 100.0],
    "balanced": [200.0, 210.0, 190.0, 205.0],
    "lbbsp": [180.0, 190.0, 200.0, 190.0],
    "balanced:pool_sigmas=0": [240.0, 250.0, 230.0, 245.0],  # faster: not balanced's peer
    "balanced:deadband=0": [100.0, 105.0, 95.0, 102.5],  # half of balanced in every round
}


def test_a_strategys_own_variants_are_not_its_peers():
    table = comparison(RATES, "equal")
    # balanced against lbbsp only, round by round: 200/180, 210/190, 190/200, 205/190
    expected = float(np.median([200 / 180, 210 / 190, 190 / 200, 205 / 190]))
    assert table["balanced"]["vs_best_peer"][0] == pytest.approx(expected)
    # lbbsp's peers include the variants (the fastest of every round)
    assert table["lbbsp"]["vs_best_peer"][0] < 0.8


def test_suite_table_keeps_variants_out_and_the_ablation_table_pairs_them_with_balanced():
    text = suite_markdown([row("p1", RATES), row("p2", RATES)])
    head = text.splitlines()[0]
    assert "balanced x equal" in head and "lbbsp x equal" in head and "pool_sigmas" not in head
    assert head.endswith("| balanced / best other | balanced / top peer |")
    p1 = next(x for x in text.splitlines() if x.startswith("| p1 (REAL) |"))
    assert p1.endswith("(lbbsp) |")  # its only peer
    assert "balanced / top peer: geometric mean of the medians" in text
    ablation = ablation_markdown([row("p1", RATES)])
    assert "balanced:deadband=0 / balanced" in ablation and "balanced:pool_sigmas=0 / balanced" in ablation
    line = next(x for x in ablation.splitlines() if x.startswith("| p1 (REAL) |"))  # labelled REAL / EMULATED
    assert "0.50 [0.50, 0.50]" in line  # deadband=0: half of balanced in every round
    assert "geometric mean |" in ablation and ablation_markdown([row("p1", RATES), row("p2", RATES)]) in text
    assert ablation_markdown([row("p1", {k: v for k, v in RATES.items() if ":" not in k})]) == ""
    assert geometric_mean([1.0, 4.0, None]) == pytest.approx(2.0)


def test_an_older_suite_is_retabled_from_its_own_rates(tmp_path):
    # two profiles of a real suite run whose bench.json files were written before bench reported
    # the top peer (each strategy's paired rates kept, the per-rank breakdowns left out)
    source = pathlib.Path(__file__).parents[1] / "fixtures" / "runq-both"
    old = json.loads((source / "suite.json").read_text())
    shutil.copy(source / "suite.json", tmp_path / "suite.json")
    for row in old:
        (tmp_path / row["profile"]).mkdir()
        shutil.copy(source / row["profile"] / "bench.json", tmp_path / row["profile"] / "bench.json")
    rows = retable(str(tmp_path))
    assert [r["profile"] for r in rows] == [r["profile"] for r in old] == ["outside-100ms", "quota-schedule"]
    for new, was in zip(rows, old):
        own = new["strategies"]["balanced"]
        assert own["vs_best_other"] == was["strategies"]["balanced"]["vs_best_other"]  # measurements untouched
        assert own["top_peer"] in set(new["strategies"]) - {"balanced", "balanced:sit_out=0"}
        low, median = own["vs_top_peer"][1], own["vs_top_peer"][0]
        assert low <= median and median >= own["vs_best_other"][0]  # never stricter than the best of each round
    assert "| balanced / top peer |" in (tmp_path / "suite.md").read_text()
