"""The cost of a sequence (per sequence, per token, per squared length) fitted from passes, and
the length-aware cut of a global batch by shares of work."""

import numpy as np
import pytest

from bno_hvd.allocation.costmodel import (
    TOKENS,
    UNITS,
    SequenceCost,
    fit_sequence_cost,
    fit_warning,
    nonnegative_lstsq,
    work_per_sequence,
)
from bno_hvd.allocation.partition import rank_range, split_by_shares
from bno_hvd.allocation.sampler import UnevenSampler


def test_the_fit_recovers_the_three_terms_and_the_fixed_cost():
    true = SequenceCost(2e-4, 3e-5, 4e-7)
    rows = [(n, L, 1e-3 + true.pass_seconds(n, L)) for L in (8, 16, 32, 64, 128, 256) for n in (1, 4, 16)]
    cost, fixed, errors = fit_sequence_cost(rows)
    assert fixed == pytest.approx(1e-3, rel=1e-6)
    assert (cost.per_sequence, cost.per_token, cost.per_squared) == pytest.approx((2e-4, 3e-5, 4e-7), rel=1e-6)
    assert max(abs(e) for e in errors) < 1e-9


def test_noise_never_makes_a_term_negative():
    rng = np.random.default_rng(1)
    rows = [(n, L, (5e-4 + 2e-5 * n * L) * rng.uniform(0.8, 1.25)) for L in (8, 32, 128) for n in (1, 8)]
    cost, fixed, errors = fit_sequence_cost(rows)
    assert min(cost.per_sequence, cost.per_token, cost.per_squared, fixed) >= 0
    assert len(errors) == 6 and max(abs(e) for e in errors) < 0.5
    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert nonnegative_lstsq(x, np.array([2.0, -1.0])).tolist() == [2.0, 0.0]


def test_a_fit_off_by_more_than_a_fifth_at_some_length_gets_one_line():
    # measured-like: a sweep of 8..512 (two batch sizes per length, the fastest of 5 rounds), with
    # a few percent of noise (fits: no note), then with the passes at 256 slowed 1.8x (another
    # process on the core while they ran): the fit cannot follow, and the note names that length
    true = SequenceCost(3e-5, 2.2e-6, 1.5e-9)
    rng = np.random.default_rng(4)
    lengths = (8, 16, 32, 64, 128, 256, 512)
    rows = [(n, L, (4e-4 + true.pass_seconds(n, L)) * rng.uniform(0.97, 1.05)) for L in lengths for n in (2, 8)]
    cost, fixed, errors = fit_sequence_cost(rows)
    assert max(abs(e) for e in errors) < 0.2 and fit_warning(rows, errors) is None
    slowed = [(n, L, t * (1.8 if L == 256 else 1.0)) for n, L, t in rows]
    cost, fixed, errors = fit_sequence_cost(slowed)
    worst = max(abs(e) for (_, L, _), e in zip(slowed, errors) if L == 256)
    note = fit_warning(slowed, errors)
    assert worst > 0.2 and note is not None and note.splitlines() == [note], note
    assert f"off by {worst:.1%} at length 256 (more than 20%" in note
    assert fit_warning(slowed, errors, limit=1.0) is None  # the limit is the one given


def test_work_is_in_thousandths_of_the_mean_sequence():
    lengths = np.array([4, 8, 12])
    assert work_per_sequence(lengths, TOKENS).tolist() == [500.0, 1000.0, 1500.0]
    square = work_per_sequence(lengths, SequenceCost(0, 0, 1.0))
    assert square.mean() == pytest.approx(UNITS) and square[2] == pytest.approx(9 * square[0])


def test_shares_are_filled_by_sequences_shortest_to_the_smallest_share():
    work = np.array([10, 10, 20, 40, 80, 300], dtype=float)
    counts = split_by_shares(work, [1, 1, 1, 3])
    assert counts == [3, 1, 1, 1] and sum(counts) == 6
    assert rank_range(counts, [1, 1, 1, 3], 3) == (5, 6)  # the largest share takes the longest
    rng = np.random.default_rng(0)
    work = np.sort(rng.uniform(50, 150, 400))
    shares = [3, 3, 3, 1]
    counts = split_by_shares(work, shares)
    for r in range(4):
        lo, hi = rank_range(counts, shares, r)
        assert work[lo:hi].sum() / work.sum() == pytest.approx(shares[r] / 10, abs=0.01)
    with pytest.raises(ValueError, match="cannot give each of 4 ranks one"):
        split_by_shares([1, 2, 3], [1, 1, 1, 1])


def test_the_sampler_cuts_global_batches_of_tokens_every_sample_once():
    lengths = np.random.default_rng(2).integers(1, 40, 97)
    sampler = UnevenSampler(97, seed=5, lengths=lengths, work=lengths * 1.0, global_tokens=150)
    seen = []
    for step in range(30):
        shares = [1 + step % 3, 2, 3, 1]
        start = sampler.position
        total = sampler.batch_count(start, shares)
        counts = sampler.counts_at(start, shares)
        parts = [sampler.slice_at(start, shares, r)[0] for r in range(4)]
        assert [len(p) for p in parts] == counts and sum(counts) == total and min(counts) >= 1
        batch = np.concatenate(parts)
        # the fewest next sequences that reach 150 tokens: without its last one it would not
        assert lengths[batch].sum() >= 150 and lengths[batch].sum() - lengths[batch].max() < 150 or total == 4
        seen += batch.tolist()
        sampler.advance(total)
    assert sorted(set(seen)) == list(range(97)) and len(seen) > 2 * 97  # (once per epoch: tests/library)
