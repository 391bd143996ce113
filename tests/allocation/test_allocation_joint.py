"""Ranks under one CPU limit fitted together (``fit_joint``): a rank held at one batch size cannot
resolve its fixed cost alone, their steps together can."""

import numpy as np
import pytest

from bno_hvd.allocation import ClusterMetrics, make_strategy

ZERO_LAT = [[0.0] * 4 for _ in range(4)]


def _uneven_equal_limits(rng, sizes=(47, 32, 47), a=0.020, c=0.0015, jitter=0.05):
    """16 steps per rank at the sizes an old split left them, all at one CPU limit: each step
    ``a + c * b`` (a fixed cost of 13 samples) times a uniform jitter of +-5%."""
    return [[(b, (a + c * b) * float(rng.uniform(1 - jitter, 1 + jitter))) for _ in range(16)] for b in sizes]


def test_ranks_with_one_limit_are_fitted_together_and_even_out():
    # Three ranks under one CPU limit, left at 47, 32, 47 samples by an earlier split. Each alone
    # sees one size: its fit through the origin charges the fixed cost per sample, so the rank at
    # 32 looks ~10% slower per sample and would be kept small (the 47,32,47 seen at a 100 ms CFS
    # period). Their steps together span two sizes and resolve the fixed cost: the split evens out.
    from bno_hvd.allocation.fitting import fit_affine, fit_joint

    rng = np.random.default_rng(7)
    windows = _uneven_equal_limits(rng)
    alone = [fit_affine(w, 16) for w in windows]
    assert all(fit[0] == 0 for fit in alone)  # origin fits, and far apart:
    assert alone[1][1] / alone[0][1] > 1.08
    fit, members = fit_joint(windows, 16, None, 2.24)
    assert members == [0, 1, 2]
    assert fit[0] == pytest.approx(0.020, rel=0.25) and fit[1] == pytest.approx(0.0015, rel=0.1)

    slow = [(2, 0.02 + 0.006 * 2)] * 16  # rank 3 at its own, lower limit
    m = ClusterMetrics(
        ops=[1] * 4,
        memory_used=[1e9] * 4,
        latency=ZERO_LAT,
        compute_samples=windows + [slow],
        cpu_limit=[0.45, 0.45, 0.45, 0.1],
    )
    got = make_strategy("balanced", 4, 32).rebalance(m, [47, 32, 47, 2], 16)
    assert sum(got) == 128 and max(got[:3]) <= 1.1 * min(got[:3]), got


def test_a_rank_slower_than_its_limit_says_is_not_fitted_with_the_others():
    # Same limit, but rank 2 also shares its core with another process: 30% slower at every size.
    # Its mean residual from the joint fit is far beyond its steps' noise, so it keeps its own fit.
    from bno_hvd.allocation.fitting import fit_joint

    rng = np.random.default_rng(8)
    windows = _uneven_equal_limits(rng, sizes=(48, 24, 36))
    windows[2] = [(b, t * 1.3) for b, t in windows[2]]
    fit, members = fit_joint(windows, 16, None, 2.24)
    assert members == [0, 1] and fit[1] == pytest.approx(0.0015, rel=0.2)
    # one size among all of them: nothing to resolve, every rank keeps its own fit
    assert fit_joint(_uneven_equal_limits(rng, sizes=(32, 32, 32)), 16, None, 2.24) == (None, [])
