"""Largest-remainder rounding with bounds: exact sums, bounds respected, infeasible -> UsageError."""

import pytest

from bno_hvd.allocation import UsageError, round_to_total


def test_largest_remainder_ties_go_to_lower_rank():
    assert round_to_total([2.5, 2.5, 5.0], 10) == [3, 2, 5]


def test_largest_remainder_prefers_biggest_fraction():
    # floors [38, 38, 38, 12] = 126; remainders .4,.4,.4,.8 -> rank 3 then rank 0.
    assert round_to_total([38.4, 38.4, 38.4, 12.8], 128) == [39, 38, 38, 13]


def test_values_are_scaled_to_the_total():
    assert round_to_total([1, 1, 2], 8) == [2, 2, 4]
    assert round_to_total([0, 0, 0], 7) == [3, 2, 2]  # no information -> even split


def test_lower_bound_takes_excess_from_smallest_remainders():
    # [0, 5, 5] -> rank 0 raised to 1, sum 11; the unit comes off the first rank above the
    # lower bound with the smallest remainder (ranks 1 and 2 tie at 0 -> rank 1).
    assert round_to_total([0, 5, 5], 10) == [1, 4, 5]
    # [0.01, 0.01, 9.98] -> [1, 1, 9] = 11; only rank 2 can give.
    assert round_to_total([0.01, 0.01, 9.98], 10) == [1, 1, 8]


def test_upper_bound_is_respected_and_excess_flows_elsewhere():
    got = round_to_total([50, 25, 25], 100, upper=[30, None, None])
    assert got == [30, 35, 35]


def test_bulk_distribution_when_far_from_total():
    got = round_to_total([10, 10, 10, 10], 40, upper=[1, 1, 1, None])
    assert got == [1, 1, 1, 37]


@pytest.mark.parametrize("total", [4, 5, 17, 1000])
def test_sum_and_bounds_invariant(total):
    values = [0.3, 7.7, 1.2, 100.0]
    caps = [None, 8, None, None]
    got = round_to_total(values, total, upper=caps)
    assert sum(got) == total
    assert all(b >= 1 for b in got) and got[1] <= 8


def test_infeasible_raises():
    with pytest.raises(UsageError, match="at least 4"):
        round_to_total([1, 1, 1, 1], 3)
    with pytest.raises(UsageError, match="memory caps"):
        round_to_total([1, 1], 10, upper=[4, 5])
    with pytest.raises(UsageError, match="below the minimum"):
        round_to_total([1, 1], 10, upper=[0, None])
    with pytest.raises(UsageError, match="non-finite"):
        round_to_total([1, float("nan")], 10)
    with pytest.raises(UsageError, match="integer"):
        round_to_total([1, 1], 10.0)
