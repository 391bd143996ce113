"""Token sequences through the real DataLoader (2 workers per rank, the allocation lag) on 4 ranks
under mpirun while the split changes every 2 updates: every sequence exactly once per epoch, each
rank's sequences shortest first, and the token weights of every update summing to 1."""

import json
from collections import Counter

import pytest
from support.jobs import ROOT, assert_ok, mpirun, python_cmd

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("mode", ["counts", "shares"])
def test_every_sequence_once_per_epoch_through_workers(tmp_path, mode):
    data = tmp_path / "data"
    data.mkdir()
    words = "the cat sat on a mat while bno hvd trains transformers on text of every length".split()
    lines = [" ".join(words[(i * 7) % 5 :][: 1 + (i * 11) % 17]) + f" {i}" for i in range(45)]
    (data / "docs.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    proc = mpirun(4, python_cmd(f"{ROOT}/tests/support/mpi_scripts/text_coverage.py", str(data), str(out), mode))
    assert_ok(proc)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    n, lengths = ranks[0]["n"], ranks[0]["lengths"]
    by_update = {}
    for r in ranks:
        for s in r["seen"]:
            assert s["lengths"] == sorted(s["lengths"])  # shortest first: micro-batches pad little
            assert s["lengths"] == [lengths[i] for i in s["indices"]]
            assert len(s["indices"]) == s["sizes"][r["rank"]] >= 1
            by_update.setdefault(s["update"], []).append(s)
    assert sorted(by_update) == list(range(40))
    batches = []
    for update in sorted(by_update):
        parts = by_update[update]
        assert len(parts) == 4 and len({tuple(p["sizes"]) for p in parts}) == 1
        assert abs(sum(p["weight"] for p in parts) - 1.0) < 1e-12
        tokens = sum(sum(p["lengths"]) for p in parts)
        assert all(p["global_tokens"] == tokens for p in parts)
        if mode == "shares":  # sequences that reach 60 tokens (at least one per rank)
            ordered = sorted(i for p in parts for i in p["indices"])
            assert tokens >= 60 or len(ordered) == 4
        batches.append(Counter(i for p in parts for i in p["indices"]))
    assert len({tuple(p["sizes"]) for parts in by_update.values() for p in parts}) > 3  # the split changed
    assert epochs_completed(batches, n) >= 2


def epochs_completed(batches, n):
    """Walk the global batches (multisets of indices): within an epoch no index twice; a batch that
    crosses an epoch's end must hold every index the epoch still misses, and the rest starts the next."""
    seen, epochs = set(), 0
    for batch in batches:
        missing = Counter(set(range(n)) - seen)
        if sum(batch.values()) < len(missing):
            assert max(batch.values()) == 1 and not seen & set(batch), "a sequence twice in one epoch"
            seen |= set(batch)
            continue
        assert not missing - batch, "an epoch ended without some sequences"
        rest = batch - missing
        assert not rest or max(rest.values()) == 1
        seen, epochs = set(rest), epochs + 1
    return epochs
