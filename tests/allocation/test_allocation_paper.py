"""BNO eqs. (1)-(5) against hand-computed examples, including every documented degenerate case."""

import math

import pytest

from bno_hvd.allocation import (
    ClusterMetrics,
    UsageError,
    bno_batch_sizes,
    compute_k,
    make_strategy,
    memory_weights,
    network_weights,
)
from bno_hvd.common.errors import WarningLog

NAN = float("nan")

# Symmetric line topology 0-1-2-3 (ms): row maxima 4, 2, 2, 4.
LINE = [[0, 1, 2, 4], [1, 0, 1, 2], [2, 1, 0, 1], [4, 2, 1, 0]]
UNIFORM = [[0 if i == j else 1e-3 for j in range(4)] for i in range(4)]


def test_eq1_k_is_share_of_throughput():
    assert compute_k([100, 100, 100, 200]) == [0.2, 0.2, 0.2, 0.4]


def test_eq2_memory_weight():
    assert memory_weights([2, 2, 4, 8]) == [0.875, 0.875, 0.75, 0.5]


def test_eq4_network_weights_divide_by_row_max():
    assert network_weights(LINE) == [
        [1.0, 0.75, 0.5, 0.0],
        [0.5, 1.0, 0.5, 0.0],
        [0.0, 0.5, 1.0, 0.5],
        [0.0, 0.5, 0.75, 1.0],
    ]


def test_eq5_example_line_topology():
    # K = [.2,.2,.2,.4], MW = .75 each, sum NCW = [2.25, 2, 2, 2.25], B = 32:
    # rank 0: (0.2+0.75+2.25)/3*32 = 34.13 -> 34;  ranks 1,2: 2.95/3*32 = 31.47 -> 31;
    # rank 3: (0.4+0.75+2.25)/3*32 = 36.27 -> 36.  Global batch 132 != 128: the paper's drift.
    assert bno_batch_sizes([100, 100, 100, 200], [1e9] * 4, LINE, 32) == [34, 31, 31, 36]


def test_eq5_example_slow_rank_uneven_memory():
    # K = [100,100,100,33]/333, MW = [7/8, 7/8, 3/4, 1/2], uniform latency -> sum NCW = 1, B = 64:
    # rank 0,1: (0.3003+0.875+1)/3*64 = 46.41 -> 46;  rank 2: (0.3003+0.75+1)/3*64 = 43.74 -> 43;
    # rank 3: (0.0991+0.5+1)/3*64 = 34.11 -> 34.
    assert bno_batch_sizes([100, 100, 100, 33], [2, 2, 4, 8], UNIFORM, 64) == [46, 46, 43, 34]


def test_eq5_floor_epsilon_guard():
    # Rank 1: (0.25 + 0.8 + 1)/3*60 = 41 exactly, but float arithmetic gives 40.99999999999999.
    assert (0.25 + 0.8 + 1.0) / 3 * 60 < 41
    assert bno_batch_sizes([1, 1, 1, 1], [1, 2, 3, 4], UNIFORM, 60) == [43, 41, 39, 37]


def test_one_rank():
    # K = 1, MW = 1 - 7/7 = 0, NCW = [[1]]: floor(2/3 * 32) = 21.
    assert memory_weights([7]) == [0.0]
    assert network_weights([[0]]) == [[1.0]]
    assert bno_batch_sizes([5], [7], [[0]], 32) == [21]


def test_one_rank_zero_memory_matches_nonzero():
    # All-zero rule gives 1 - 1/N = 0 for N = 1, same as with memory in use.
    assert memory_weights([0]) == [0.0]
    assert bno_batch_sizes([5], [0], [[0]], 32) == [21]


def test_one_rank_tiny_batch_is_at_least_one():
    assert bno_batch_sizes([5], [7], [[0]], 1) == [1]  # floor(2/3) = 0 -> max(0, 1)


def test_all_zero_latency_row_gives_all_ones():
    assert network_weights([[0, 0], [0, 0]]) == [[1.0, 1.0], [1.0, 1.0]]


def test_all_memory_zero_is_one_minus_one_over_n():
    assert memory_weights([0, 0, 0, 0]) == [0.75, 0.75, 0.75, 0.75]


def test_missing_and_zero_ops():
    assert compute_k([None, NAN, math.inf, 100]) == [0.0, 0.0, 0.0, 1.0]
    assert compute_k([0, 0, 0, 0]) == [0.25, 0.25, 0.25, 0.25]
    assert compute_k([None, None]) == [0.5, 0.5]


def test_all_degenerate_at_once():
    # K = 1/4, MW = 3/4, NCW sum = 4 (all-zero latency): (0.25+0.75+4)/3*32 = 53.33 -> 53.
    zeros = [[0.0] * 4 for _ in range(4)]
    assert bno_batch_sizes([None, NAN, 0, 0], [0] * 4, zeros, 32) == [53, 53, 53, 53]


def test_starved_rank_still_gets_one_sample():
    # Rank 1: K = 0, MW = 0 (uses all memory), NCW row = [1, 0]: floor(1/3 * 2) = 0 -> 1.
    assert bno_batch_sizes([10, 0], [0, 5], [[0, 1], [1, 0]], 2) == [2, 1]


def test_bad_inputs_raise_usage_error():
    with pytest.raises(UsageError):
        compute_k([-1, 2])
    with pytest.raises(UsageError):
        bno_batch_sizes([1, 1], [1, 1], [[0, 1]], 32)  # not square
    with pytest.raises(UsageError):
        bno_batch_sizes([1, 1], [1, 1], [[0, 1], [1, 0]], 0)
    with pytest.raises(UsageError):
        memory_weights([1, NAN])


def metrics(ops, memory=(1e9,) * 4, latency=LINE, max_batch=()):
    return ClusterMetrics(ops=list(ops), memory_used=list(memory), latency=latency, max_batch=list(max_batch))


def test_bno_strategy_applies_eq5_and_changes_global_batch():
    s = make_strategy("bno", 4, 32)
    assert s.changes_global_batch is True
    assert s.initial() == [32, 32, 32, 32]
    assert s.rebalance(metrics([100, 100, 100, 200]), [32] * 4, update=10) == [34, 31, 31, 36]
    assert s.last_warning is None


def test_bno_strategy_keeps_current_on_missing_metrics_and_warns_once():
    s = make_strategy("bno", 4, 32)
    current = [30, 30, 30, 30]
    assert s.rebalance(metrics([100, None, 100, 200]), current, update=10) == current
    assert "rank(s) [1]" in s.last_warning
    log = WarningLog()  # the one warning channel: the same condition twice is reported once
    log.warn(s.last_warning)
    s.rebalance(metrics([100, None, 100, 200]), current, update=20)
    log.warn(s.last_warning)
    assert len(log.drain()) == 1
    assert s.rebalance(metrics([100, 100, 100, 200]), current, update=30) == [34, 31, 31, 36]
    assert s.last_warning is None


def test_bno_strategy_is_eq5_also_with_memory_caps():
    # a share above a cap is processed in micro-batches, so the cap does not change eq. (5)
    s = make_strategy("bno", 4, 32)
    got = s.rebalance(metrics([100, 100, 100, 200], max_batch=[None, None, None, 20]), [32] * 4, 1)
    assert got == [34, 31, 31, 36]


def test_bno_rejects_a_global_batch():
    with pytest.raises(UsageError, match="global-batch"):
        make_strategy("bno", 4, 32, global_batch=100)
