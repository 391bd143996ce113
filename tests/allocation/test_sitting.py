"""Measured sit-out trials of ``balanced`` (bno_hvd.allocation.sitting): a rank whose cost is in
the allreduce, where the model does not see it, is tried out and kept out only when the updates
measured without it are faster."""

import re

import numpy as np

from bno_hvd.allocation import ClusterMetrics, make_strategy
from bno_hvd.allocation.fitting import predicted_step, split_without
from bno_hvd.allocation.sitting import Measured, SitOuts, measured_step, starved

MS = 1e-3
ZERO_LAT = [[0.0] * 4 for _ in range(4)]


def run(strategy, rebalances, hidden, shares, sizes=None, every=10, window=20, until=None, limits=lambda k: [None] * 4):
    """Rebalance as rank 0 would. Each rank computes ``1 ms + per_sample * b`` (2% jitter); the
    allreduce takes 8 ms plus ``hidden[i]`` for every rank i that takes part (a cost the compute
    fits cannot see: a rank descheduled in every ring step). Every rank leaves the allreduce
    together, so an update lasts the slowest compute plus the allreduce; a rank that sits out
    reports nothing of it. ``shares``: each rank's CPU per wall second; ``until``: the rebalance
    from which the hidden cost is gone (the busy processes left); ``limits(k)``: the CPU limits
    each rank reports at rebalance k; ``hidden`` and ``shares`` may be functions of k too.
    Returns splits and notes."""
    per_sample = 0.5 * MS
    rng = np.random.default_rng(0)
    sizes = list(sizes or [32] * 4)
    steps, syncs, cycles = [[] for _ in range(4)], [[] for _ in range(4)], [[] for _ in range(4)]
    history, notes = [list(sizes)], []
    for k in range(rebalances):
        for u in range(every * k, every * (k + 1)):
            inside = [i for i in range(4) if sizes[i] > 0]
            compute = {i: (MS + per_sample * sizes[i]) * (1 + 0.02 * rng.standard_normal()) for i in inside}
            now = hidden(k) if callable(hidden) else hidden
            extra = 0.0 if until is not None and k >= until else sum(now[i] for i in inside)
            allreduce = (8 * MS + extra) * (1 + 0.02 * rng.standard_normal())
            end = max(compute.values()) + allreduce
            for i in inside:
                steps[i] = (steps[i] + [(sizes[i], compute[i])])[-window:]
                syncs[i] = (syncs[i] + [(u, end - compute[i])])[-window:]
                cycles[i] = (cycles[i] + [(u, end)])[-window:]
        metrics = ClusterMetrics(
            ops=[None if b == 0 else b / (MS + per_sample * b) for b in sizes],
            memory_used=[1e9] * 4,
            latency=ZERO_LAT,
            compute_samples=[list(s) for s in steps],
            sync_samples=[list(s) for s in syncs],
            cycle_samples=[list(s) for s in cycles],
            cpu_share=list(shares(k) if callable(shares) else shares),
            cpu_limit=limits(k),
        )
        sizes = strategy.rebalance(metrics, sizes, every * (k + 1))
        history.append(list(sizes))
        notes.append(strategy.last_note)
    return history, notes


def sitting_out(**options):
    strategy = make_strategy("balanced", 4, 32, **options)
    strategy.sit_out_ok = True  # what the Balancer of bno-hvd's own loop sets
    return strategy


STARVED = [0.33, 0.33, 0.32, 0.06]  # rank 3 shares its core with busy processes
HIDDEN = [0.0, 0.0, 0.0, 80 * MS]  # ... and every ring step waits for it


def test_a_starved_rank_whose_cost_is_in_the_allreduce_is_tried_out_and_stays_out():
    history, notes = run(sitting_out(), 12, HIDDEN, STARVED)
    # the model sees equal compute and keeps 32 each; the first rebalance tries rank 3 out
    assert history[1][3] == 0 and sorted(history[1]) == [0, 42, 43, 43], history  # (the three fitted apart)
    assert notes[0].startswith("rank 3 is tried out for one interval: it gets 0.18 of the others")
    # the interval without it measured ~30 ms per update against ~105: it stays out
    assert history[2][3] == 0 and notes[1].startswith("rank 3 sits out: measured"), notes[1]
    without, with_ = (float(x) for x in re.findall(r"(\d+) ms", notes[1]))
    assert 0 < without < 0.5 * with_
    # the model (which predicts its return pays: it computes as fast as the others) cannot call
    # it back; after sit_out = 4 rebalances out it is measured again, is slower, and leaves for 8
    back = [k for k in range(2, len(history)) if history[k][3] > 0]
    assert back[0] == 6 and notes[back[0] - 1].startswith("rank 3 is back: after 4 rebalances out"), notes
    assert history[back[0] + 1][3] == 0 and notes[back[0]].startswith("rank 3 sits out again: measured")
    assert all(h[3] == 0 for h in history[back[0] + 1 :]), history  # out for 8 now: to the end
    assert all(sum(h) == 128 and max(h[:3]) - min(h[:3]) <= 1 for h in history)


def test_a_rank_back_that_no_longer_slows_the_updates_stays_and_is_not_tried_again_at_once():
    # the busy processes leave at rebalance 4, while rank 3 is out (its CPU share, as it reports
    # it, still looks starved): back after 4 rebalances out, it measures no slower and stays
    history, notes = run(sitting_out(), 16, HIDDEN, STARVED, until=4)
    assert [h[3] == 0 for h in history[1:7]] == [True] * 5 + [False], history
    assert notes[6] is None and history[7] == [32] * 4  # not slower with it: it stays
    # no new trial for sit_out = 4 rebalances; then one, which measures no gain and ends, and
    # the next one only 4 rebalances after that (8 after the next)
    out = [k for k, h in enumerate(history) if k > 6 and h[3] == 0]
    assert out == [11, 16], history
    assert notes[11].startswith("rank 3 is back: its trial measured"), notes[11]


def test_a_rank_whose_limit_rose_is_measured_at_its_share_not_tried_out():
    # rank 3 is tried out and stays out (its cost is in the allreduce); a limit of 0.1 of a core is
    # set on it while it is out, which rises at rebalance 3, and (its share still looks starved) at
    # rebalance 4 it is not tried out again: it is back at a typical share to be measured
    limits = [None, None, 0.1, 0.5, 0.5, 0.5, 0.5, 0.5]
    history, notes = run(sitting_out(), 8, HIDDEN, STARVED, until=3, limits=lambda k: [None] * 3 + [limits[k]])
    assert [h[3] == 0 for h in history[1:4]] == [True] * 3, history
    assert history[4][3] >= 30 and notes[3].startswith("rank 3 is back: its CPU limit rose"), (history, notes)
    assert all(h[3] > 0 for h in history[4:]), history


def test_a_trial_that_does_not_pay_ends_and_is_tried_again_ever_later():
    # rank 3 gets little CPU (a sleeping emulated rank, a rank that waits), but costs nothing in
    # the allreduce: every trial measures the update slower without its samples
    history, notes = run(sitting_out(), 20, [0.0] * 4, STARVED)
    out = [k for k, h in enumerate(history) if h[3] == 0]
    assert out == [1, 6, 15], (out, history)  # tried at once, then after 4 rebalances back, then after 8
    for k in out:
        assert notes[k].startswith("rank 3 is back: its trial measured"), notes[k]
        assert history[k + 1] == [32] * 4
    # every other split is the model's: equal ranks keep 32 each
    assert all(h == [32] * 4 for k, h in enumerate(history) if k not in out)


def test_no_trial_without_a_starved_rank_or_where_it_is_turned_off():
    even = [0.33, 0.33, 0.32, 0.3]
    assert all(h == [32] * 4 for h in run(sitting_out(), 8, HIDDEN, even)[0])  # nobody starved
    assert all(h == [32] * 4 for h in run(sitting_out(starved_share=0), 8, HIDDEN, STARVED)[0])
    assert all(h == [32] * 4 for h in run(sitting_out(sit_out=0), 8, HIDDEN, STARVED)[0])
    assert all(h == [32] * 4 for h in run(make_strategy("balanced", 4, 32), 8, HIDDEN, STARVED)[0])  # user's loop
    # rank 0 is never tried out, however little CPU it gets
    assert all(h[0] > 0 for h in run(sitting_out(), 8, [80 * MS, 0, 0, 0], [0.06, 0.33, 0.33, 0.32])[0])


def test_measurements_of_the_updates_a_rank_sat_out():
    cycles = [[(u, 0.1 if u < 10 else 0.03) for u in range(20)], [], [], []]
    syncs = [[], [], [], [(u, 0.05) for u in range(10)]]  # rank 3 took part in updates 0-9
    metrics = ClusterMetrics(
        ops=[1.0] * 4, memory_used=[1e9] * 4, latency=ZERO_LAT, sync_samples=syncs, cycle_samples=cycles
    )
    assert measured_step(metrics, 0, 3, present=True).seconds == 0.1
    assert measured_step(metrics, 0, 3, present=False).seconds == 0.03
    assert measured_step(metrics, 12).count == 8 and measured_step(metrics, 18) is None  # < 3 updates
    fast, slow = Measured(0.03, 0.01, 10), Measured(0.1, 0.01, 10)
    assert fast.faster_than(slow, 0.05, 2.24) and not slow.faster_than(fast, 0.05, 2.24)
    assert not Measured(0.09, 0.05, 10).faster_than(slow, 0.05, 2.24)  # 10% faster, but in the noise
    metrics.cpu_share = [0.3, 0.3, 0.1, 0.29]
    assert starved(metrics, 0.5) == 2 and starved(metrics, 0.3) is None and starved(metrics, 0) is None
    metrics.cpu_share = [0.3, 0.3, None, 0.29]
    assert starved(metrics, 0.5) is None  # a share not known: no trial
    # both shares must agree where both are known (the run-queue share alone tried an unthrottled rank out)
    metrics.cpu_share, metrics.cpu_per_wall = [0.3, 0.3, 0.1, 0.29], [0.5, 0.5, 0.1, 0.5]
    assert starved(metrics, 0.5) == 2
    # a rank whose CPU limit binds is starved by it, and the model charges it already: never tried
    metrics.cpu_limit = [None, None, 0.12, None]
    assert starved(metrics, 0.5) is None
    metrics.cpu_share, metrics.cpu_per_wall = [0.3, 0.3, 0.1, 0.12], [0.5, 0.5, 0.1, 0.2]
    assert starved(metrics, 0.5) == 3  # the starved rank with no limit is, against every rank's share
    metrics.cpu_limit = [None] * 4
    metrics.cpu_per_wall = [0.5, 0.5, 0.4, 0.5]  # its threads queued, but it used as much CPU per second
    assert starved(metrics, 0.5) is None
    # logged under load: two unthrottled ranks on MPI, whose yielding waits are always runnable
    two = ClusterMetrics(ops=[1.0] * 2, memory_used=[1e9] * 2, latency=[[0, 0], [0, 0]])
    two.cpu_share, two.cpu_per_wall = [0.056, 0.026], [0.9, 0.85]
    assert starved(two, 0.5) is None
    two.cpu_per_wall = [0.9, 0.3]  # and with less CPU per second as well: starved
    assert starved(two, 0.5) == 1


def test_a_starved_rank_is_tried_out_at_once_where_the_fit_moves_too():
    # the first interval ran at a split the fit moves away from: the trial does not wait for the
    # fit's split (REAL competing-process waited 9 intervals at 0.15 of the others' share, while
    # the noisy fits of ranks sharing cores moved the split at every rebalance)
    history, notes = run(sitting_out(), 3, HIDDEN, STARVED, sizes=[50, 30, 30, 18])
    assert history[1][3] == 0 and sum(history[1]) == 128 and max(history[1]) <= 44, (history, notes)  # the fit's
    assert notes[0].startswith("rank 3 is tried out") and notes[1].startswith("rank 3 sits out: measured"), notes


def test_a_trial_measured_against_a_bad_split_is_undone_when_the_rank_is_measured_again():
    # rank 3 costs nothing in the allreduce, but the interval before its trial ran a split that
    # gave it 104 samples (61 ms per update): the three without it at 43 each (31 ms) measure
    # faster, so it stays out; after sit_out = 4 rebalances it is back at the fit's share, whose
    # updates (25 ms) are no slower than those without it, and it stays
    history, notes = run(sitting_out(), 9, [0.0] * 4, STARVED, sizes=[8, 8, 8, 104])
    assert [h[3] == 0 for h in history[1:7]] == [True] * 5 + [False], (history, notes)
    assert notes[0].startswith("rank 3 is tried out") and notes[1].startswith("rank 3 sits out: measured"), notes
    assert notes[5].startswith("rank 3 is back: after 4 rebalances out"), notes
    assert notes[6] is None and history[7] == [32] * 4, (history, notes)


def test_a_trial_after_many_updates_is_measured_against_the_interval_just_before():
    # 260 updates: the busy processes reach rank 3's core at update 100, after balanced has kept
    # more than arrival_window (64) updates of sync rows. The trial must be measured against the
    # last interval (every update ~105 ms), not the whole window: before the fix, dropping the
    # old rows rebound the rebalance's `update`, the trial's baseline mixed the quiet interval
    # before (~25 ms) into a median of 65 ms with a large spread, the trial "failed" and rank 3
    # came back at 105 ms per update for four intervals
    quiet = [0.33, 0.33, 0.32, 0.3]
    history, notes = run(
        sitting_out(), 26, lambda k: HIDDEN if k >= 10 else [0.0] * 4, lambda k: STARVED if k >= 10 else quiet
    )
    assert all(h == [32] * 4 for h in history[:11]), history
    assert notes[10].startswith("rank 3 is tried out") and notes[11].startswith("rank 3 sits out: measured"), notes
    without, with_ = (float(x) for x in re.findall(r"(\d+) ms", notes[11]))
    assert without < 40 and 95 < with_ < 120, notes[11]  # the baseline is the interval with the busy processes
    out = [k for k, h in enumerate(history) if h[3] == 0]
    assert out == [11, 12, 13, 14, 15] + list(range(17, 26)), (out, history)  # back only to be measured again


def test_a_rank_out_comes_back_on_the_model_only_where_its_return_pays_twice_the_deadband():
    # rank 3 (under a limit that binds: never measured again) sits out beside three ranks at
    # 1 ms per sample; its charge (offset) sets what the update with it would take. At the
    # deadband alone, its old fit against the others' new ones took ranks out and back on noise
    # (random-40-40 in the simulator: 545 ms per update with the rank back, 72 without it)
    def decide(offset):
        model = (np.zeros(4), np.full(4, MS), None, np.array([0.0, 0.0, 0.0, offset * MS]), None)
        now = predicted_step(model, split_without(model, [3], 128))
        gain = 1 - predicted_step(model, split_without(model, [], 128)) / now
        sitouts = SitOuts(4, 0.5)
        sitouts.out = {3: [1, 4, False]}  # out one rebalance, by the model's prediction
        metrics = ClusterMetrics(ops=[1.0] * 4, memory_used=[1e9] * 4, latency=ZERO_LAT, cpu_limit=[0.5] * 4)
        fit = split_without(model, [], 128)  # the fit's split with every rank, as balanced passes it
        sizes, note = sitouts.decide(model, fit, [43, 43, 42, 0], [True] * 4, metrics, 20, 128, 0.05, 2.24, True)
        return gain, sizes, note

    gain, sizes, note = decide(32.0)  # with it: 40 ms against 43
    assert 0.05 < gain < 0.10 and sizes == [43, 43, 42, 0] and note is None, (gain, sizes)
    gain, sizes, note = decide(14.0)  # with it: 35.5 ms against 43
    assert gain > 0.10 and sizes[3] > 0 and note == "rank 3 is back: the model predicts its return pays", (gain, note)
