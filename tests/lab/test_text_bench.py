"""``bno-hvd bench --dataset text`` on 2 ranks: the entries side by side, tokens/s beside
samples/s, and the same perplexity for every entry (they train the same global batches)."""

import json
import re

import pytest
from support.jobs import assert_ok, bno_cmd, mpirun

from bno_hvd.allocation import STRATEGY_NAMES
from bno_hvd.lab.textbench import parse_entries


def test_entries_parse_and_bad_ones_are_refused():
    assert parse_entries("equal:samples, balanced", STRATEGY_NAMES) == [("equal", "samples"), ("balanced", "cost")]
    for bad in ("equal:bytes", "fastest:cost", "bno:cost", "equal:tokens,equal:tokens"):
        try:
            parse_entries(bad, STRATEGY_NAMES)
        except ValueError as err:
            assert "\n" not in str(err)
        else:
            raise AssertionError(bad)


@pytest.mark.mpi
def test_text_bench_compares_entries_on_the_same_batches(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    lines = [" ".join(f"w{(i * j) % 23}" for j in range(1 + (i * 13) % 40)) for i in range(80)]
    (data / "d.txt").write_text("\n".join(lines) + "\n")
    args = ["bench", "--dataset", "text", "--model", "gpt-mini", "--data-dir", str(data), "--max-seq-len", "32"]
    args += ["--vocab-size", "300", "--dtype", "float64", "--updates", "8", "--warmup", "2", "--rebalance-every", "2"]
    args += ["--strategies", "equal:samples,equal:tokens,balanced:cost", "--base-batch-size", "4"]
    args += ["--latency-interval", "0", "--no-progress", "--out", str(tmp_path / "out")]
    proc = mpirun(2, bno_cmd(*args), timeout=400)
    assert_ok(proc)
    out = re.sub(r"\[\d+,\d+\]<stdout>:", "", proc.stdout)  # mpirun's per-rank output tags
    for entry in ("equal:samples", "equal:tokens", "balanced:cost"):
        assert re.search(rf"^{entry}\s", out, re.M), out
    rows = json.loads((tmp_path / "out" / "bench-text.json").read_text())["rows"]
    assert [r["entry"] for r in rows] == ["equal:samples", "equal:tokens", "balanced:cost"]
    assert all(r["tokens_per_s"] > r["samples_per_s"] > 0 for r in rows)
    assert rows[0]["vs_equal_sequences"] == 1.0
    perplexities = [r["perplexity"] for r in rows]
    assert max(perplexities) - min(perplexities) <= 1e-9 * perplexities[0]  # same batches, same model
