"""The model behind balanced: fit_affine and solve_equal_finish (allocation/fitting.py)."""

import math

import pytest

from bno_hvd.allocation import (
    UsageError,
    fit_affine,
    solve_equal_finish,
)

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
    # found by tests/cli/test_fuzz_inputs.py: c ~ 1e-22 next to a = 1e-6 made solve_equal_finish's
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


def test_a_memory_cap_costs_a_pass_per_micro_batch_not_a_bound():
    # t_i(b) = a_i * ceil(b / cap_i) + c_i * b. With caps of 16 and a 10 ms pass, the fast ranks
    # take 37.33 samples in 3 passes (0.0673 s); the slow rank stays at one full pass of 16
    # (0.058 s): a second pass would cost 10 ms for the few samples it could add.
    a, c = [0.01] * 4, [0.001, 0.001, 0.001, 0.003]
    b = solve_equal_finish(a, c, 128, [16] * 4)
    assert b == pytest.approx([112 / 3] * 3 + [16.0])
    t = [ai * math.ceil(x / 16 - 1e-9) + ci * x for ai, ci, x in zip(a, c, b)]
    assert t[:3] == pytest.approx([0.01 * 3 + 0.001 * 112 / 3] * 3) and t[3] == pytest.approx(0.058)
    # large caps change nothing: the plain equal-finish split (b proportional to 1/c: 3:3:3:1)
    assert solve_equal_finish(a, c, 128, [64] * 4) == pytest.approx([38.4, 38.4, 38.4, 12.8])
    # per-update offsets (a slower link) move work off that rank
    # T* = (128 + 30 + 0.013 / 0.003) / 3333.3 = 0.0487 s, so rank 3 gets (T* - 0.013) / 0.003
    assert solve_equal_finish(a, c, 128, None, [0, 0, 0, 0.003])[3] == pytest.approx(11.9)


def test_equal_finish_holds_a_rank_at_one_sample():
    # Rank 2's fixed cost (10 s) exceeds any common finish time: it keeps 1 sample.
    assert solve_equal_finish([0, 0, 10], [0.01, 0.01, 0.01], 100) == pytest.approx([49.5, 49.5, 1.0])


def test_equal_finish_infeasible_raises():
    with pytest.raises(UsageError):
        solve_equal_finish([0, 0], [1, 1], 1)  # fewer samples than ranks
    with pytest.raises(UsageError):
        solve_equal_finish([0, 0], [1, 0], 10)
    with pytest.raises(UsageError):
        solve_equal_finish([0, 0], [1, 1], 10, [0, 4])


def test_pooling_joins_ranks_within_their_noise_and_keeps_real_differences_apart():
    from bno_hvd.allocation.fitting import pool_indistinguishable

    # three ranks 10% apart with 10% noise: one fit; a rank 3x slower stays apart
    a, c, groups = pool_indistinguishable([0.0] * 4, [1.0, 1.1, 0.95, 3.0], [0.1] * 4, 32, 2.24)
    assert groups == [[2, 0, 1]] and c.tolist() == pytest.approx([3.05 / 3] * 3 + [3.0])
    # the same ranks measured precisely (1% noise): nothing to pool
    assert pool_indistinguishable([0.0] * 4, [1.0, 1.1, 0.95, 3.0], [0.01] * 4, 32, 2.24)[2] == []
    # affine fits are compared at the mean share; pooled ranks get the mean fixed cost too
    a, c, groups = pool_indistinguishable([2.0, 0.0], [1.0, 1.0625], [0.05, 0.05], 32, 2.24)
    assert sorted(groups[0]) == [0, 1] and a.tolist() == [1.0, 1.0] and c.tolist() == pytest.approx([1.03125] * 2)
    # 0 sigmas: never
    assert pool_indistinguishable([0.0] * 2, [1.0, 1.0001], [0.5, 0.5], 32, 0.0)[2] == []


def test_ranks_of_different_kinds_are_never_pooled():
    from bno_hvd.allocation.fitting import pool_indistinguishable

    # within each other's noise, but one is known to run under another CPU limit
    c = [1.0, 1.05, 1.02, 1.1]
    assert pool_indistinguishable([0.0] * 4, c, [0.2] * 4, 32, 2.24)[2] == [[0, 2, 1, 3]]
    kinds = [-0.7, -0.7, -1.8, -1.8]  # log of limits 0.5, 0.5, 0.17, 0.17
    assert pool_indistinguishable([0.0] * 4, c, [0.2] * 4, 32, 2.24, kinds)[2] == [[0, 1], [2, 3]]


def test_a_rank_with_no_samples_takes_no_time_and_the_others_split_the_batch():
    from bno_hvd.allocation.fitting import predicted_step, split_without

    model = ([0.0, 0.0, 0.0, 0.05], [0.001, 0.001, 0.002, 0.01], None, [0.0, 0.0, 0.0, 0.1])
    assert predicted_step(model, [40, 40, 20, 0]) == pytest.approx(0.04)  # rank 3 sits out: not its 0.15 s
    assert predicted_step(model, [40, 40, 20, 1]) == pytest.approx(0.16)
    sizes = split_without(model, 3, 128)
    assert sizes[3] == 0 and sum(sizes) == 128 and sizes[0] == sizes[1] and abs(sizes[0] - 2 * sizes[2]) <= 2
    # memory caps of the others stay with them
    capped = ([0.01] * 4, [0.001] * 4, [16, 16, 16, 16], [0.0] * 4)
    assert split_without(capped, 1, 96)[1] == 0 and sum(split_without(capped, 1, 96)) == 96
