"""``balanced``: affine fits, equal-finish solve, caps, deadband, smoothing, latency, missing ranks."""

import json

import pytest

from bno_hvd.allocation import (
    ClusterMetrics,
    UsageError,
    fit_affine,
    latency_offsets,
    make_strategy,
    solve_equal_finish,
)

ZERO_LAT = [[0.0] * 4 for _ in range(4)]


def metrics(ops, samples=(), max_batch=(), latency=ZERO_LAT):
    return ClusterMetrics(
        ops=list(ops),
        memory_used=[1e9] * len(ops),
        latency=latency,
        compute_samples=[list(s) for s in samples],
        max_batch=list(max_batch),
    )


def strategy(**options):
    options.setdefault("smoothing", 0.0)
    options.setdefault("deadband", 0.0)
    return make_strategy("balanced", 4, 25, **options)


# -- fit_affine ------------------------------------------------------------------------------


def test_fit_affine_recovers_exact_line():
    a, c = fit_affine([(10, 0.2), (20, 0.3), (40, 0.5)])
    assert a == pytest.approx(0.1) and c == pytest.approx(0.01)


def test_fit_affine_ignores_a_hiccup_but_follows_a_real_slowdown():
    steady = [(32, 0.32)] * 7
    assert fit_affine(steady + [(32, 2.6)]) == (0.0, pytest.approx(0.01))  # one 8x hiccup
    slowed = [(32, 0.32)] * 3 + [(32, 0.96)] * 5  # 3x, for good
    assert fit_affine(slowed) == (0.0, pytest.approx(0.03))


def test_fit_affine_single_batch_size_goes_through_origin():
    assert fit_affine([(32, 0.64), (32, 0.66)]) == (0.0, pytest.approx(0.65 / 32))


def test_fit_affine_unresolvable_slope_falls_back_to_origin():
    # found by tests/test_fuzz_inputs.py: c ~ 1e-22 next to a = 1e-6 made solve_equal_finish's
    # bisection run out of float64 resolution, and its assertion ended `bno-hvd allocate`
    a, c = fit_affine([(1, 1e-6), (3, 1.0000000000000002e-6)])
    assert a == 0.0 and c == pytest.approx(4e-7)


def test_fit_affine_noise_with_negative_slope_falls_back_to_origin():
    a, c = fit_affine([(10, 0.5), (20, 0.4)])
    assert a == 0.0 and c == pytest.approx((10 * 0.5 + 20 * 0.4) / (100 + 400))


def test_fit_affine_ignores_bad_pairs_and_uses_window():
    assert fit_affine([]) is None
    assert fit_affine([(10, float("nan")), (0, 1.0), (5, 0.0)]) is None
    # Only the last 2 pairs count: the first (huge) one is outside the window.
    assert fit_affine([(10, 99.0), (10, 0.1), (20, 0.2)], window=2) == (pytest.approx(0.0), pytest.approx(0.01))


# -- solve_equal_finish ----------------------------------------------------------------------

A = [0.1, 0.2, 0.0, 0.05]
C = [0.01, 0.02, 0.005, 0.01]


def test_equal_finish_on_known_affine_model():
    # T* = (100 + 10 + 10 + 0 + 5) / (100 + 50 + 200 + 100) = 125/450.
    b = solve_equal_finish(A, C, 100)
    t_star = 125 / 450
    assert b == pytest.approx([(t_star - a) / c for a, c in zip(A, C)])
    assert sum(b) == pytest.approx(100)
    finish = [a + c * x for a, c, x in zip(A, C, b)]
    assert finish == pytest.approx([t_star] * 4)


def test_equal_finish_cap_holds_rank_and_resolves_others():
    # Rank 2 wants 55.6 > 40: held at 40; the rest share 60: T* = (60 + 25)/250 = 0.34.
    b = solve_equal_finish(A, C, 100, [None, None, 40, None])
    assert b == pytest.approx([24.0, 7.0, 40.0, 29.0])
    assert [a + c * x for a, c, x in zip(A, C, b)] == pytest.approx([0.34, 0.34, 0.2, 0.34])


def test_equal_finish_holds_a_rank_at_one_sample():
    # Rank 2's fixed cost (10 s) exceeds any common finish time: it keeps 1 sample.
    assert solve_equal_finish([0, 0, 10], [0.01, 0.01, 0.01], 100) == pytest.approx([49.5, 49.5, 1.0])


def test_equal_finish_infeasible_raises():
    with pytest.raises(UsageError):
        solve_equal_finish([0, 0], [1, 1], 100, [10, 10])
    with pytest.raises(UsageError):
        solve_equal_finish([0, 0], [1, 0], 10)


# -- BalancedStrategy ------------------------------------------------------------------------


def test_speeds_one_one_one_third_split_proportional_to_speed():
    # c = [1, 1, 1, 3]/R, a = 0: b ∝ 1/c = [1, 1, 1, 1/3] -> G * [3, 3, 3, 1]/10.
    r = 100.0
    assert strategy().rebalance(metrics([r, r, r, r / 3]), [25] * 4, 1) == [30, 30, 30, 10]
    # G = 128: [38.4, 38.4, 38.4, 12.8] -> largest remainder [39, 38, 38, 13].
    s = make_strategy("balanced", 4, 32, smoothing=0.0, deadband=0.0)
    assert s.rebalance(metrics([r, r, r, r / 3]), [32] * 4, 1) == [39, 38, 38, 13]
    assert s.changes_global_batch is False


def test_affine_samples_drive_the_split():
    # Ranks 0-2: t = 0.1 + 0.01 b; rank 3: t = 0.1 + 0.03 b. T* = 0.4 -> [30, 30, 30, 10].
    fast = [(16, 0.1 + 0.16), (32, 0.1 + 0.32)]
    slow = [(16, 0.1 + 0.48), (32, 0.1 + 0.96)]
    got = strategy().rebalance(metrics([1.0] * 4, samples=[fast, fast, fast, slow]), [25] * 4, 1)
    assert got == [30, 30, 30, 10]


def test_memory_cap_holds_rank_and_others_share_the_rest():
    got = strategy().rebalance(metrics([100] * 4, max_batch=[None, None, None, 10]), [25] * 4, 1)
    assert got == [30, 30, 30, 10]


def test_global_batch_option():
    s = make_strategy("balanced", 4, 25, global_batch=40, deadband=0.0)
    assert s.initial() == [10, 10, 10, 10]
    assert s.rebalance(metrics([100, 100, 100, 100 / 3]), [10] * 4, 1) == [12, 12, 12, 4]


def test_deadband_keeps_current_for_small_predicted_gain():
    # c = [.01, .01, .01, .03]: current [31, 30, 29, 10] takes max(.31, .30, .29, .30) = .31 s;
    # the proposal [30, 30, 30, 10] takes .30 s: a 3.2% gain, inside a 5% deadband.
    current = [31, 30, 29, 10]
    assert strategy(deadband=0.05).rebalance(metrics([100, 100, 100, 100 / 3]), current, 1) == current
    assert strategy(deadband=0.03).rebalance(metrics([100, 100, 100, 100 / 3]), current, 1) == [30, 30, 30, 10]
    assert strategy().rebalance(metrics([100, 100, 100, 100 / 3]), current, 1) == [30, 30, 30, 10]


def test_deadband_moves_for_big_predicted_gain():
    s = strategy(deadband=0.05)
    # rank 3 at half speed: equal split takes 25 * .02 = .5 s, [29, 29, 28, 14] takes .29 s.
    assert s.rebalance(metrics([100, 100, 100, 50]), [25, 25, 25, 25], 1) == [29, 29, 28, 14]


def test_deadband_ignores_noise_on_equal_ranks():
    # 2% measurement noise on equal ranks: the best split gains < 2%, so nothing moves.
    s = strategy(deadband=0.05)
    assert s.rebalance(metrics([100, 102, 98, 101]), [25] * 4, 1) == [25] * 4


def test_deadband_never_keeps_an_invalid_current():
    s = strategy(deadband=0.5)
    assert s.rebalance(metrics([100] * 4), [25, 25, 25, 24], 1) == [25, 25, 25, 25]


def test_a_real_change_is_taken_at_once_not_smoothed():
    s = strategy(smoothing=0.5)
    s.rebalance(metrics([100] * 4), [25] * 4, 1)
    # rank 3 becomes 3x slower (beyond the 1.5x jump threshold): its new cost is used directly
    assert s.rebalance(metrics([100, 100, 100, 100 / 3]), [25] * 4, 2) == [30, 30, 30, 10]
    assert s.c[3] == pytest.approx(0.03)


def test_smoothing_converges_geometrically():
    s = strategy(smoothing=0.5)
    s.rebalance(metrics([100] * 4), [25] * 4, 1)
    assert s.c.tolist() == pytest.approx([0.01] * 4)
    slow = metrics([100, 100, 100, 100 / 1.4])  # rank 3 now needs c = 0.014 (< the 1.5x jump)
    s.rebalance(slow, [25] * 4, 2)
    assert s.c[3] == pytest.approx(0.012)
    s.rebalance(slow, [25] * 4, 3)
    assert s.c[3] == pytest.approx(0.013)
    for update in range(4, 24):
        got = s.rebalance(slow, [25] * 4, update)
    assert s.c[3] == pytest.approx(0.014 - 0.004 * 0.5**22)
    assert got == [27, 27, 27, 19]  # b proportional to 1 / [.01, .01, .01, .014]: 26.9 x3, 19.2


def test_latency_moves_work_off_a_rank_on_a_slow_link():
    # Rank 3's round trips are 0.06 s, the others' 0 among themselves: mean 0.02 vs 0.06, so
    # rank 3's fixed cost grows by 0.04 s = 4 samples at c = 0.01: 4b - 4 = 100 -> b = 26.
    lat = [[0, 0, 0, 0.06], [0, 0, 0, 0.06], [0, 0, 0, 0.06], [0.06, 0.06, 0.06, 0]]
    assert latency_offsets(ClusterMetrics([1] * 4, [1] * 4, lat).latency_array()).tolist() == pytest.approx(
        [0, 0, 0, 0.04]
    )
    assert strategy().rebalance(metrics([100] * 4, latency=lat), [25] * 4, 1) == [26, 26, 26, 22]
    assert strategy(latency_weight=0.0).rebalance(metrics([100] * 4, latency=lat), [25] * 4, 1) == [25] * 4


def test_missing_rank_keeps_its_last_fit():
    s = strategy()
    first = s.rebalance(metrics([100, 100, 100, 50]), [25] * 4, 1)
    again = s.rebalance(metrics([100, 100, 100, None], latency=[[float("nan")] * 4] * 4), first, 2)
    assert again == first == [29, 29, 28, 14]
    assert "rank(s) [3]" in s.last_warning


def test_never_measured_rank_gets_the_median_fit():
    s = strategy()
    got = s.rebalance(metrics([100, 50, 100, float("nan")]), [25] * 4, 1)
    # Rank 3 borrows the median c = 0.01 -> speeds [1, .5, 1, 1] -> 100/3.5 = 28.57 x3, 14.29.
    assert got == [29, 14, 29, 28]
    assert min(got) >= 1 and "rank(s) [3]" in s.last_warning


def test_nothing_measured_keeps_current():
    s = strategy()
    assert s.rebalance(metrics([None] * 4), [20, 30, 25, 25], 1) == [20, 30, 25, 25]
    assert "no rank" in s.last_warning


def test_state_dict_round_trip():
    s = strategy(smoothing=0.5)
    s.rebalance(metrics([100, 100, 100, 50]), [25] * 4, 1)
    state = json.loads(json.dumps(s.state_dict()))
    t = strategy(smoothing=0.5)
    t.load_state_dict(state)
    nxt = metrics([100, 100, 100, 100 / 3])
    assert t.rebalance(nxt, [25] * 4, 2) == s.rebalance(nxt, [25] * 4, 2)
    with pytest.raises(UsageError, match="same --strategy"):
        make_strategy("lbbsp", 4, 25).load_state_dict(state)


def test_bad_options_raise():
    with pytest.raises(UsageError, match="valid options"):
        make_strategy("balanced", 4, 25, smoothin=0.5)
    with pytest.raises(UsageError, match="smoothing"):
        make_strategy("balanced", 4, 25, smoothing=1.0)
    with pytest.raises(UsageError, match="global batch"):
        make_strategy("balanced", 4, 25, global_batch=3)


def test_latency_offsets_ignore_unmeasured_pairs():
    nan = float("nan")
    lat = ClusterMetrics([1] * 3, [1] * 3, [[0, nan, 0.01], [nan, 0, 0.03], [0.01, 0.03, 0]]).latency_array()
    # Means over measured pairs only: 0.01, 0.03, 0.02 -> minus the minimum 0.01.
    assert latency_offsets(lat).tolist() == pytest.approx([0.0, 0.02, 0.01])
    assert latency_offsets(ClusterMetrics([1], [1], [[0]]).latency_array()).tolist() == [0.0]
