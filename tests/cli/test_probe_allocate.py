"""`bno-hvd probe` under horovodrun measures a real metrics table and writes the JSON that
`bno-hvd allocate` reads back (the offline path of the paper's allocation)."""

import json

import pytest
from support.jobs import assert_ok, bno_cmd, horovodrun, run_cli

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("np_", [1, 4])
def test_probe_then_allocate(np_, tmp_path):
    metrics = tmp_path / "metrics.json"
    proc = horovodrun(
        np_, bno_cmd("probe", "--steps", "3", "--batch-size", "8", "--repeats", "2", "--out", str(metrics)), timeout=240
    )
    assert_ok(proc)
    assert "latency matrix NL_ij (ms)" in proc.stdout
    data = json.loads(metrics.read_text())
    assert len(data["ops"]) == np_ and all(x > 0 for x in data["ops"])
    assert len(data["memory_used"]) == np_ and all(x > 1e6 for x in data["memory_used"])  # RSS of a torch process
    lat = data["latency"]
    assert len(lat) == np_ and all(len(row) == np_ for row in lat)
    assert all(lat[i][i] == 0 for i in range(np_))
    assert all(lat[i][j] > 0 for i in range(np_) for j in range(np_) if i != j)
    out = run_cli("allocate", "--metrics", str(metrics), "--strategy", "bno", "--base-batch-size", "32")
    assert_ok(out)
    sizes = json.loads(out.stdout)["batch_sizes"]
    assert len(sizes) == np_ and all(b >= 1 for b in sizes)
    balanced = json.loads(
        run_cli("allocate", "--metrics", str(metrics), "--strategy", "balanced", "--base-batch-size", "32").stdout
    )["batch_sizes"]
    assert sum(balanced) == 32 * np_
