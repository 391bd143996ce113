"""Real multi-rank runs (mpirun / horovodrun on CPU) of Horovod and the mpi4py control plane."""

import json

import pytest
from support.jobs import assert_ok, horovodrun, mpirun, python_cmd

pytestmark = pytest.mark.mpi


def test_weighted_allreduce_matches_closed_form():
    """4 ranks (on one rank every sample is 0: the closed form would hold with any weight)."""
    proc = horovodrun(4, python_cmd("tests/support/mpi_scripts/weighted_allreduce.py"), timeout=240)
    assert_ok(proc)
    assert proc.stdout.count("ok=True") == 4


@pytest.mark.parametrize("np_", [1, 4])
def test_control_plane_gather_broadcast_and_latency_matrix(np_, tmp_path):
    proc = mpirun(np_, python_cmd("tests/support/mpi_scripts/control_plane.py", str(tmp_path)), timeout=240)
    assert_ok(proc)
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(r["rank"] for r in records) == list(range(np_))
    assert all(r["failures"] == [] for r in records), records
    assert len({tuple(r["sizes"]) for r in records}) == 1  # every rank got the same allocation
    for r in records:
        assert len(r["latency_ms"]) == np_ and r["latency_ms"][r["rank"]] == 0
