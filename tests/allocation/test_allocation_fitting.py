"""The model behind balanced: fit_shape and solve_equal_finish (allocation/fitting.py)."""

import math

import numpy as np
import pytest

from bno_hvd.allocation import (
    UsageError,
    fit_shape,
    solve_equal_finish,
)

# -- fit_shape -------------------------------------------------------------------------------


def steps(c, k, sizes, cap=None):
    passes = [1 if cap is None else math.ceil(b / cap) for b in sizes]
    return [(b, c * (k * m + b)) for b, m in zip(sizes, passes)]


def test_fit_shape_recovers_one_fixed_cost_and_each_ranks_speed():
    windows = [steps(0.01, 5.0, [16, 32]), steps(0.03, 5.0, [8, 24, 8]), steps(0.02, 5.0, [20] * 4)]
    k, c = fit_shape(windows, [None] * 3, 16, 32)
    assert k == pytest.approx(5.0, rel=0.01) and c.tolist() == pytest.approx([0.01, 0.03, 0.02], rel=0.01)
    # a memory cap: the fixed cost is paid once per pass
    k, c = fit_shape([steps(0.01, 5.0, [8, 20, 36], cap=8)], [8], 16, 32)
    assert k == pytest.approx(5.0, rel=0.01) and c[0] == pytest.approx(0.01, rel=0.01)


def test_one_size_keeps_the_shape_it_had():
    windows = [steps(0.01, 5.0, [32] * 8), steps(0.03, 5.0, [8] * 8)]
    k, c = fit_shape(windows, [None] * 2, 16, 32, shape=5.0)
    assert k == 5.0 and c.tolist() == pytest.approx([0.01, 0.03])
    k, c = fit_shape(windows, [None] * 2, 16, 32)  # no shape yet: through the origin
    assert k == 0.0 and c.tolist() == pytest.approx([0.01 * 37 / 32, 0.03 * 13 / 8])


def test_every_step_counts_and_bad_pairs_do_not():
    # a rank under a 91 ms CFS period at 4 samples: 3.7 ms within its budget, 85 ms a period
    # later. Dropping the slow half as outliers of the median fitted it 20x too fast (284 samples).
    bimodal = [(4, 0.0037), (4, 0.085)] * 3 + [(4, 0.0037)] * 4
    _, c = fit_shape([bimodal], [None], 16, 64)
    assert c[0] == pytest.approx(sum(t for _, t in bimodal) / 40)
    k, c = fit_shape([[], [(10, float("nan")), (0, 1.0), (5, 0.0)]], [None] * 2, 16, 32)
    assert np.isnan(c).all()
    k, c = fit_shape([[(10, 99.0), (10, 0.1), (20, 0.2)]], [None], 2, 32)  # the window: the last 2
    assert k == 0.0 and c[0] == pytest.approx(0.01)


def test_ranks_known_to_run_at_one_speed_share_one_fit():
    # three ranks under one limit, left at 47, 32, 47 samples by an earlier split, steps +-5%:
    # fitted apart, the one at 32 looks slower; fitted together, they are one speed
    rng = np.random.default_rng(7)
    windows = [[(b, 0.0015 * (13 + b) * float(rng.uniform(0.95, 1.05))) for _ in range(16)] for b in (47, 32, 47)]
    _, apart = fit_shape(windows, [None] * 3, 16, 32)
    assert apart[1] / apart[0] > 1.1
    k, together = fit_shape(windows, [None] * 3, 16, 32, groups=[[0, 1, 2]])
    assert together.tolist() == [together[0]] * 3


def test_ranks_at_one_speed_under_different_caps_price_a_pass_at_one_size():
    # two ranks under one limit, both held at 32 samples, one under a memory cap of 8 (4 passes):
    # no size varies, yet the group's steps tell the fixed cost of a pass (the random 423rd
    # simulated profile of seed 40 left it at 0, so ranks with a cap of 4 were given as many
    # samples as their uncapped peers and set the update at 2.7x their time)
    windows = [steps(0.01, 5.0, [32] * 8), steps(0.01, 5.0, [32] * 8, cap=8)]
    k, c = fit_shape(windows, [None, 8], 16, 32, groups=[[0, 1]])
    assert k == pytest.approx(5.0, rel=0.01) and c.tolist() == pytest.approx([0.01, 0.01], rel=0.01)
    k, _ = fit_shape(windows, [None, 8], 16, 32)  # fitted apart: one size each tells nothing
    assert k == 0.0


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
