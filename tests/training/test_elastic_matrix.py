"""The fault matrix of ``--elastic``: 20 seeded schedules of kills (SIGKILL, one rank, two at once,
rank 0, during a re-formation), leaves (SIGTERM) and joins (a rank that rejoins after a kill),
each on a real 4-worker job bounded in time; launch/test runs 8 of them that hold every kind
(``FAULT_SEEDS``), ``BNO_FAULT_SEEDS=all`` the 20. Every schedule that runs: exit 0, the ledger check
passes (no sample lost or repeated), final parameters == one process on the same global batches
(float64, <= 1e-10). Recoveries (kill -> next committed update) are printed (``pytest -s``), not
asserted: a speed figure (docs/elastic.md)."""

import pytest
from support.elastic_jobs import ALL_SEEDS, CI_SEEDS, FAULT_SEEDS, ElasticJob, random_schedule
from test_elastic import UPDATES, check_job, one_process, recoveries  # noqa: F401 - the fixture


@pytest.mark.parametrize("seeds", [CI_SEEDS, ALL_SEEDS], ids=["launch-test", "all"])
def test_the_schedules_cover_every_kind_of_fault(seeds):
    """Pure: the schedules that run hold each kind (the 8 of launch/test, and the 20)."""
    kinds = {kind for seed in seeds for _, kind, _ in random_schedule(seed, UPDATES)}
    assert {"kill", "term", "kill2", "join", "kill-recovering"} <= kinds
    assert any(kind == "kill" and target == 0 for s in seeds for _, kind, target in random_schedule(s, UPDATES))
    kinds_of = [[k for _, k, _ in random_schedule(s, UPDATES)] for s in seeds]
    assert any("kill" in ks and "join" in ks[ks.index("kill") :] for ks in kinds_of)  # a rank that rejoins


@pytest.mark.mpi
@pytest.mark.alone  # a collective's timeout tells a death: no other test's load beside it
@pytest.mark.parametrize("seed", FAULT_SEEDS)
def test_fault_schedule(seed, tmp_path, fashion_dir, one_process):  # noqa: F811 - the fixture
    schedule = random_schedule(seed, UPDATES)
    job = ElasticJob(tmp_path, fashion_dir, updates=UPDATES)
    job.run_schedule(schedule)
    entries = check_job(job, one_process, schedule)
    print(f"seed {seed}: {job.events}; recoveries {[round(t, 2) for t in recoveries(job, entries)]} s")
