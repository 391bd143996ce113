"""A MetricsMonitor without a communicator (a torchrun job: no MPI for the latency probes) still
reports a latency row of one entry per rank, so rank 0 can build the cluster's matrix: with a
row of one entry, every rebalance of ``bno-hvd train/bench --engine torch`` under torchrun failed
("allocation failed (non-broadcastable output operand ...)") and kept the first split."""

import math

from bno_hvd.allocation import make_strategy
from bno_hvd.library.control.monitor import MetricsMonitor
from bno_hvd.library.control.plane import RankReport, allocate_on_root, reports_to_metrics


def test_a_monitor_without_a_communicator_has_a_row_per_rank():
    rows = [MetricsMonitor(None, rank=r, size=4).latest_row().tolist() for r in range(4)]
    assert all(len(row) == 4 and row[r] == 0 for r, row in enumerate(rows))
    assert all(math.isnan(x) for r, row in enumerate(rows) for i, x in enumerate(row) if i != r)
    assert MetricsMonitor(None).latest_row().tolist() == [0.0]  # alone: a world of one


def test_rank_zero_allocates_from_such_rows():
    reports = [
        RankReport(
            rank=r,
            ops=100.0 * (r + 1),
            memory_used=1e9,
            latency_row=MetricsMonitor(None, rank=r, size=4).latest_row().tolist(),
            compute_samples=[(8, 0.08 / (r + 1))] * 3,
        )
        for r in range(4)
    ]
    assert reports_to_metrics(reports).latency == [[0.0] * 4] * 4  # nothing measured: no link costs more
    sizes, warning = allocate_on_root(make_strategy("proportional", 4, 8), reports, [8] * 4, 3)
    assert warning is None and sum(sizes) == 32 and sizes[3] > sizes[0], (sizes, warning)
