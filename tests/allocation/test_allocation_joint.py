"""Ranks under one CPU limit share one fit (``fit_shape``'s groups): a rank held at one batch size
cannot tell its fixed cost from its per-sample cost alone; with the others it need not."""

import numpy as np

from bno_hvd.allocation import ClusterMetrics, make_strategy

ZERO_LAT = [[0.0] * 4 for _ in range(4)]


def test_ranks_with_one_limit_are_fitted_together_and_even_out():
    # Three ranks under one CPU limit, left at 47, 32, 47 samples by an earlier split, each step
    # (a + c b) with a fixed cost of 13 samples, +-5%. Alone, the rank at 32 looks ~10% slower
    # per sample and would be kept small (the 47,32,47 seen at a 100 ms CFS period); with one
    # fit for the three, the split evens out.
    rng = np.random.default_rng(7)
    windows = [[(b, (0.020 + 0.0015 * b) * float(rng.uniform(0.95, 1.05))) for _ in range(16)] for b in (47, 32, 47)]
    slow = [(2, 0.02 + 0.006 * 2)] * 16  # rank 3 at its own, lower limit
    m = ClusterMetrics(
        ops=[1] * 4,
        memory_used=[1e9] * 4,
        latency=ZERO_LAT,
        compute_samples=windows + [slow],
        cpu_limit=[0.45, 0.45, 0.45, 0.1],
    )
    got = make_strategy("balanced", 4, 32).rebalance(m, [47, 32, 47, 2], 16)
    assert sum(got) == 128 and max(got[:3]) - min(got[:3]) <= 1, got
    # without the limits nothing says they run at one speed: the rank at 32 stays smaller
    m.cpu_limit = [None] * 4
    apart = make_strategy("balanced", 4, 32).rebalance(m, [47, 32, 47, 2], 16)
    assert apart[1] < min(apart[0], apart[2]) - 1, apart
