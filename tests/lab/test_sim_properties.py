"""Properties every allocation policy should have, checked on the simulator (bno_hvd.lab.sim):
pure, no MPI, seconds. A property ``balanced`` breaks is marked xfail(strict=True) with the
numbers measured here: a change that makes it pass removes the marker, and none weakens it."""

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from bno_hvd.lab.sim.engine import build_strategy, simulate
from bno_hvd.lab.sim.families import DEFAULT_STRATEGIES, random_profile
from bno_hvd.lab.sim.machine import Machine, SimProfile
from bno_hvd.lab.sim.realsuite import BY_NAME

MACHINE = Machine.load()
QUIET = replace(MACHINE, noise=(0.0,))  # a split's own time, without the recorded step noise
STATIC = ("quota-own-10ms", "outside-100ms", "outside-two-slow-20ms", "outside-tiny-20ms", "outside-levels-10ms")
LEVELS = SimProfile("8-ranks-2-levels", [0.8] * 4 + [0.3] * 4, 20.0)


def rng_profiles(count, seed, most=8, schedules=False):
    """Random family profiles of at most ``most`` ranks (with or without a schedule)."""
    rng, out = np.random.default_rng(seed), []
    while len(out) < count:
        p = random_profile(rng, f"prop-{seed}-{len(out)}")
        if p.n <= most and (schedules or not p.schedule):
            out.append(p)
    return out


SHARE_PROFILES = [BY_NAME[n] for n in ("outside-equal-10ms", "outside-two-slow-20ms", "quota-own-10ms")] + [LEVELS]


def test_ranks_under_one_limit_keep_shares_within_5_percent():
    beyond = []  # (profile, split): a rank of a group under one limit off the group's mean share
    for profile in SHARE_PROFILES:
        groups = [np.flatnonzero(np.array(profile.limits) == x) for x in set(profile.limits)]
        splits = [s for seed in range(10) for s in simulate(profile, MACHINE, "balanced", 150, seed=seed).splits[2:]]
        for split in splits:  # after the first two rebalances
            for g in groups:
                b = np.array(split)[g]
                if len(g) > 1 and (b > 0).all() and np.abs(b - b.mean()).max() > max(0.05 * b.mean(), 1.0):
                    beyond.append((profile.name, split))
    assert not beyond, beyond  # (a rank that sits out is not compared: 0 samples is no share)


def test_a_rank_slowed_2x_loses_its_share_within_2_intervals_and_gets_it_back_within_2():
    half = [0.5, 0.5, 0.25, 0.5]
    profile = SimProfile("slowed", [0.5] * 4, 10.0, schedule=[(50, half, [0] * 4), (110, [0.5] * 4, [0] * 4)])
    run = simulate(profile, MACHINE, "balanced", 170, seed=2)
    share = [s[2] / np.mean([s[0], s[1], s[3]]) for s in run.splits]  # splits[k]: taken at update 10 * k
    assert share[4] > 0.9, share  # before: an equal share
    assert share[7] < 0.75, share  # after rebalances at 60 and 70: its share follows its speed
    assert share[13] > 0.9, share  # after rebalances at 120 and 130: back


@pytest.mark.parametrize("sit_out_ok", [False, True], ids=["held-small", "sitting-out"])
def test_a_rank_whose_limit_rises_from_006_to_045_gets_its_share_back_within_2_intervals(sit_out_ok):
    # quota-tiny-lifted's shape: rank 3 at 0.06 of a core is held at 1 sample (or sits out) until
    # its limit is lifted at update 60. What it measured under the old limit must not hold it
    # there: the old balanced kept it at 1 sample to the end where it could not sit out (its
    # arrival penalty, measured while it was starved, was never measured again)
    profile = SimProfile("lifted", [0.45, 0.45, 0.45, 0.06], 20.0, schedule=[(60, [0.45] * 4, [0] * 4)])
    strategy = build_strategy("balanced", profile)
    strategy.sit_out_ok = sit_out_ok
    run = simulate(profile, MACHINE, strategy, 150, seed=1)
    share = [s[3] / np.mean(s[:3]) for s in run.splits]  # splits[k]: taken at update 10 * k
    assert max(share[1:7]) < 0.1, share  # starved: 1 sample or none
    assert min(share[8:]) > 0.75, share  # after the rebalances at 70 and 80: its share


def test_four_ranks_at_a_tiny_limit_sit_out_together_and_that_beats_one_at_a_time():
    # 8 ranks, four at 0.03 of a core: none of the four alone is worth removing (the other three
    # hold the update as long), so one at a time held them at 1 sample each
    profile = SimProfile("8-ranks-4-tiny", [0.2] * 4 + [0.03] * 4, 20.0)
    one = build_strategy("balanced", profile, seed=3)
    one.sitouts.most = 1  # the ablation's one-at-a-time
    several, single = (simulate(profile, MACHINE, spec, 150, seed=3) for spec in ("balanced", one))
    out = [tuple(i for i, b in enumerate(s) if b == 0) for s in several.splits]
    assert out[1] == (4, 5, 6, 7) and out[-1] == (4, 5, 6, 7), several.splits  # at the first rebalance, and at the end
    assert max(len(o) for o in [tuple(i for i, b in enumerate(s) if b == 0) for s in single.splits]) <= 1
    gain = several.rates(20, 1)[0] / single.rates(20, 1)[0]
    assert gain > 1.5, gain  # measured 2.4 (the four back to be measured every 4, then 8 rebalances)


@pytest.mark.parametrize("profile", rng_profiles(12, 7, most=16, schedules=True), ids=lambda p: p.name)
def test_the_global_batch_is_always_kept(profile):
    for spec in DEFAULT_STRATEGIES:
        run = simulate(profile, MACHINE, spec, 80, seed=3)
        for split in run.splits:
            assert sum(split) == profile.global_batch and min(split) >= 0 and split[0] >= 1, (spec, split)


def static_time(profile, split, cache):
    """The simulated update time of ``split`` kept all the time (no noise; the mean over two
    period phases, which differ by up to ~2%: the resolution of this prediction)."""
    key = tuple(split)
    if key not in cache:
        cache[key] = float(
            np.mean([simulate(profile, QUIET, list(split), 40, seed=s).seconds[10:].mean() for s in (0, 1)])
        )
    return cache[key]


def test_no_split_is_taken_that_is_predicted_slower_than_the_current_one():
    # It failed (xfail) from 2026-11-27 until the calibration was fitted to suite-1127a's ratios
    # (2026-11-28): 61,44,23,0 -> 61,40,27,0 1.06x slower at outside-levels-10ms and
    # 100,26,104,26 -> 127,0,129,0 1.11x at prop-11-2, where the old machine's busy ranks hid a
    # sync cost from the model (docs/simulator.md, Properties)
    slower = []
    for profile in [BY_NAME[n] for n in STATIC] + rng_profiles(3, 11):
        cache = {}
        run = simulate(profile, MACHINE, "balanced", 120, seed=4)
        for before, after in zip(run.splits, run.splits[1:]):
            if before != after:
                t0, t1 = static_time(profile, before, cache), static_time(profile, after, cache)
                if t1 > 1.02 * t0:
                    slower.append((profile.name, before, after, round(t1 / t0, 3)))
    assert not slower, slower


def rates(profile, spec, seeds=3, updates=120):
    return np.array([simulate(profile, MACHINE, spec, updates, seed=s).rates(20, 1)[0] for s in range(seeds)])


@pytest.mark.xfail(
    strict=True,
    reason="balanced is below its own best split kept fixed by more than 2 standard errors (2026-11-28, the "
    "calibration fitted to suite-1127a's times and ratios): 0.968 (noise 0.011) of 153,30,42,65,30 at prop-13-1 "
    "(text, an 85 ms period, ranks at 0.23 and 0.30 of a core, one among busy processes): its fits move with "
    "the period's phase and so does its split (153,25,43,74,25 -> 162,22,37,77,22, 1.03x slower -> "
    "154,28,38,72,28 -> ... -> 153,27,42,71,27). The same profile failed the same way on the calibration "
    "before (0.971 of 150,28,42,72,28)",
)
def test_balanced_is_never_below_the_best_fixed_split_by_more_than_its_noise():
    below = []
    for profile in [BY_NAME[n] for n in STATIC] + rng_profiles(3, 13):
        ours = rates(profile, "balanced")
        taken = Counter(tuple(s) for s in simulate(profile, MACHINE, "balanced", 120, seed=0).splits[2:])
        candidates = {"equal": "equal", "hand": "fixed"} | {str(s): list(s) for s, _ in taken.most_common(3)}
        name, best = max(((k, rates(profile, v)) for k, v in candidates.items()), key=lambda kv: kv[1].mean())
        noise = np.hypot(ours.std(ddof=1), best.std(ddof=1)) / best.mean()  # of the two means' ratio, 3 seeds each
        if ours.mean() < best.mean() * (1 - 2 * noise):
            below.append((profile.name, name, round(ours.mean() / best.mean(), 3), round(2 * noise, 3)))
    assert not below, below  # (profile, the best fixed split, balanced's ratio to it, the noise allowed)


def test_the_fixed_split_is_the_hand_split_and_only_rank_0_never_sits_out():
    profile = BY_NAME["quota-own-10ms"]
    assert build_strategy("fixed", profile).initial() == [39, 38, 38, 13]  # as lab.profiles.hand_split
    assert build_strategy("balanced", profile).sit_out_ok
