"""Benchmark arithmetic on hand-made logs with known answers."""

import math

import pytest

from bno_hvd.lab.benchstats import (
    Move,
    control_seconds,
    format_moves,
    ideal_throughput,
    moves,
    recovery_intervals,
    rolling_efficiency,
    summarize,
    with_speedups,
)
from bno_hvd.library.timing import RankStep
from bno_hvd.training.results import UpdateRecord


def make_log(cycle, batches, compute, rebalance_every=2, control=0.01):
    """Every update takes ``cycle`` s; rank r computes batches[r] in compute[r] s."""
    records, steps = [], [[] for _ in batches]
    for u in range(6):
        records.append(
            UpdateRecord(
                update=u,
                global_batch=sum(batches),
                weight_update_time=cycle,
                time=(u + 1) * cycle,
                batch_sizes=list(batches),
            )
        )
        for r in range(len(batches)):
            reb = control * (r + 1) if (u + 1) % rebalance_every == 0 else 0.0
            steps[r].append(RankStep(batches[r], compute[r], rebalance=reb))
    return records, steps


def test_summary_of_a_known_log():
    records, steps = make_log(0.5, [30, 10], [0.3, 0.5])
    s = summarize("x", records, steps, warmup=2)
    assert s.samples_per_s == pytest.approx(80.0)  # 40 samples per 0.5 s
    assert s.ideal_samples_per_s == pytest.approx(120.0)  # 30/0.3 + 10/0.5
    assert s.fraction_of_ideal == pytest.approx(80 / 120)
    # rebalances at updates 3 and 5 (after warm-up); the cheaper rank's time counts: 0.01 each
    assert control_seconds(steps, 2) == pytest.approx(0.02)
    assert s.control_overhead == pytest.approx(0.02 / 2.0)
    assert s.control_ms_per_rebalance == pytest.approx(10.0)
    assert s.mean_weight_update_time == 0.5


def test_speedups_relative_to_equal():
    a = summarize("equal", *make_log(1.0, [10, 10], [0.5, 1.0]))
    b = summarize("balanced", *make_log(0.5, [10, 10], [0.5, 0.5]))
    with_speedups([a, b])
    assert a.speedup_vs_equal == 1.0 and b.speedup_vs_equal == pytest.approx(2.0)


def test_ideal_ignores_warmup():
    steps = [[RankStep(10, 10.0), RankStep(10, 1.0)]]
    assert ideal_throughput(steps, warmup=1) == 10.0


def test_recovery_counts_rebalance_intervals():
    eff = [1, 1, 1, 0.5, 0.6, 0.7, 0.95, 1, 0.4, 0.4]
    assert recovery_intervals(eff, [3, 8], rebalance_every=2) == [2.0, None]
    # a window that still holds pre-change updates does not count as recovered
    assert recovery_intervals([1, 1, 0.95, 0.5, 0.95], [2], rebalance_every=2) == [1.5]


def test_rolling_efficiency_of_a_perfect_run_is_one():
    records, steps = make_log(0.5, [25, 25], [0.5, 0.5])
    assert rolling_efficiency(records, steps, 3) == pytest.approx([1.0] * 6)


def test_compute_balance_outside_share_and_breakdown_by_hand():
    from bno_hvd.lab.benchstats import compute_balance, compute_balance_of_means, outside_compute_share, rank_breakdown

    # two ranks, two updates: compute (0.2, 0.4) then (0.4, 0.2); every update cycle takes 0.5 s
    steps = [
        [RankStep(10, 0.2, sync=0.3, cpu=0.25, gap=0.01), RankStep(10, 0.4, sync=0.1, cpu=0.3)],
        [RankStep(10, 0.4, sync=0.1, cpu=0.4), RankStep(10, 0.2, sync=0.3, cpu=0.2, cpu_sync=0.05)],
    ]
    records = [UpdateRecord(u, [10, 10], 0.5, 20, 0.5 * (u + 1)) for u in range(2)]
    assert compute_balance(steps) == pytest.approx(0.75)  # per update (0.2 + 0.4) / 2 / 0.4
    assert compute_balance_of_means(steps) == pytest.approx(1.0)  # each rank computes 0.3 s on average
    assert outside_compute_share(records, steps) == pytest.approx(0.2)  # (0.5 - 0.4) / 0.5 in both
    rows = rank_breakdown(steps)
    assert rows[0].gap == pytest.approx(0.005) and rows[1].cpu_sync == pytest.approx(0.025)
    assert rows[0].cpu_share == pytest.approx(0.55 / 1.01)
    assert math.isnan(rows[0].cpu_alone)  # not measured
    # the allreduce alone, per rank (wall s, CPU s): the table shows the slowest rank's wall
    alone = [(0.010, 0.001), (0.012, 0.004)]
    assert [r.cpu_alone for r in rank_breakdown(steps, alone=alone)] == [0.001, 0.004]
    assert summarize("equal", records, steps, alone=alone).allreduce_alone == 0.012
    assert math.isnan(summarize("equal", records, steps).allreduce_alone)


def test_recovery_against_the_best_strategys_plateau():
    from bno_hvd.lab.benchstats import best_plateaus

    # under real throttling no strategy gets near the compute-only ideal: one plateaus at 0.5,
    # the other at 0.3; after the change at update 4 the first is back at 90% of 0.5 in its
    # second window, the second never (a strategy that does not adapt)
    fast = [0.5] * 4 + [0.2, 0.3, 0.47, 0.5, 0.5, 0.5, 0.5, 0.5]
    slow = [0.5] * 4 + [0.2] * 2 + [0.3] * 6
    limits = [0.9 * p for p in best_plateaus({"fast": fast, "slow": slow}, [4])]
    assert limits == pytest.approx([0.45])
    assert recovery_intervals(fast, [4], 2, limits) == [1.5] and recovery_intervals(slow, [4], 2, limits) == [None]


def test_moves_list_every_change_of_the_split_and_every_note():
    sizes = [[32, 32], [32, 32], [40, 24], [40, 24], [41, 23], [41, 23], [41, 23]]
    notes = {3: "probe: rank 1 from 24 to 23 samples", 5: "rank 1 sits out: measured 30 ms per update without it"}
    records = [
        UpdateRecord(u, b, weight_update_time=0.1, global_batch=64, time=u, rebalance_note=notes.get(u))
        for u, b in enumerate(sizes)
    ]
    found = moves(records)
    # a decision with a note that kept the split is listed too
    assert [(m.update, m.sizes, m.note) for m in found] == [
        (2, [40, 24], None),
        (4, [41, 23], notes[3]),
        (6, [41, 23], notes[5]),
    ]
    text = format_moves(found)
    assert text.splitlines()[:2] == ["update      2: 40,24", f"update      4: 41,23  {notes[3]}"]
    assert moves(records[:2]) == [] and moves([]) == []
    many = [Move(u, [u, 64 - u]) for u in range(20)]
    lines = format_moves(many, limit=5).splitlines()
    assert lines[:4] == [f"update {u:>6}: {u},{64 - u}" for u in range(4)]
    assert lines[4:] == ["... 15 more", "update     19: 19,45"]


def test_a_stall_is_found_and_its_logged_cause_named():
    from bno_hvd.lab.stalls import find_stalls, format_stalls

    records, steps = [], [[] for _ in range(3)]
    for u in range(40):
        cycle = {10: 1.0, 20: 0.9, 30: 0.5, 35: 0.11}.get(u, 0.1)  # 35: slower, but not a stall
        sizes = [10, 10, 0 if u == 19 else 10]
        records.append(UpdateRecord(u, sizes, weight_update_time=cycle, global_batch=sum(sizes), time=u))
        for r in range(3):
            gc = 0.8 if (u, r) == (10, 1) else 0.0  # rank 1's garbage collector ran 0.8 s
            catch_up = 0.75 if u == 20 and r in (0, 2) else 0.0  # rank 2 came back: rank 0 sent, it received
            compute = 0.45 if (u, r) == (30, 2) else 0.05 + gc  # rank 2's quota ran out
            sync = max(0.01, cycle - compute - catch_up)  # the others wait for the slowest
            steps[r].append(RankStep(sizes[r], compute, sync=sync, gc=gc, catch_up=catch_up))
    found = find_stalls(records, steps, warmup=5)
    assert [(s.update, s.cause, s.rank, s.returned) for s in found] == [
        (10, "gc", 1, None),
        (20, "catch-up", 0, 2),
        (30, "step", 2, None),
    ]
    assert found[0].median_seconds == pytest.approx(0.1) and found[0].cause_seconds == pytest.approx(0.8)
    assert find_stalls(records, steps, warmup=25)[0].update == 30  # warm-up updates are not timed
    assert format_stalls(found) == (
        "3, 2.10 s over their medians: u10 1000 ms (median 100; gc of rank 1 800 ms), "
        "u20 900 ms (median 100; catch-up of rank 0 750 ms, rank 2 back), "
        "u30 500 ms (median 100; step of rank 2 400 ms)"
    )
    assert format_stalls([]) == "none"
