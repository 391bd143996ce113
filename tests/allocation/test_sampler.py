"""The sampler's contract: order depends only on seed and epoch; every sample exactly once
per epoch under allocations that change every step; global batch independent of N."""

import numpy as np
import pytest

from bno_hvd.allocation.sampler import UnevenSampler, epoch_permutation, epoch_share, rank_slice, updates_left


def run_steps(n_data, allocations, seed=3):
    """Every rank's indices per step, each rank with its own sampler (as on a cluster)."""
    n_ranks = len(allocations[0])
    samplers = [UnevenSampler(n_data, seed=seed) for _ in range(n_ranks)]
    steps = []
    for sizes in allocations:
        steps.append([samplers[r].next_indices(sizes, r) for r in range(n_ranks)])
    return steps, samplers


def test_rank_slice_starts_at_prefix_sum():
    assert rank_slice([5, 11, 3, 13], 0) == (0, 5)
    assert rank_slice([5, 11, 3, 13], 2) == (16, 19)
    assert rank_slice([5, 11, 3, 13], 3) == (19, 32)


def test_exactly_once_per_epoch_with_allocation_changing_every_step():
    n_data = 97
    rng = np.random.default_rng(0)
    allocations = [list(rng.integers(1, 9, size=4)) for _ in range(200)]
    steps, samplers = run_steps(n_data, allocations)
    stream = np.concatenate([np.concatenate(s) for s in steps])
    full_epochs = len(stream) // n_data
    assert full_epochs >= 3
    for e in range(full_epochs):
        chunk = stream[e * n_data : (e + 1) * n_data]
        assert sorted(chunk.tolist()) == list(range(n_data)), f"epoch {e} not a permutation"
    assert samplers[0].epoch == full_epochs
    assert samplers[0].offset == len(stream) % n_data
    # all ranks advanced identically
    assert all((s.epoch, s.offset) == (samplers[0].epoch, samplers[0].offset) for s in samplers)


def test_each_slice_has_its_allocated_length():
    steps, _ = run_steps(50, [[5, 11, 3, 13], [1, 1, 1, 40]])
    assert [len(x) for x in steps[0]] == [5, 11, 3, 13]
    assert [len(x) for x in steps[1]] == [1, 1, 1, 40]


def test_global_batch_independent_of_rank_count():
    four, _ = run_steps(60, [[5, 11, 3, 13]] * 5)
    one, _ = run_steps(60, [[32]] * 5)
    for step4, step1 in zip(four, one):
        assert np.concatenate(step4).tolist() == step1[0].tolist()


def test_order_depends_only_on_seed_and_epoch():
    a = epoch_permutation(100, seed=1, epoch=2)
    assert np.array_equal(a, epoch_permutation(100, seed=1, epoch=2))
    assert not np.array_equal(a, epoch_permutation(100, seed=1, epoch=3))
    assert not np.array_equal(a, epoch_permutation(100, seed=2, epoch=2))


def test_state_round_trip_resumes_the_same_stream():
    s = UnevenSampler(41, seed=5)
    for _ in range(7):
        s.next_indices([3, 4], 1)
    t = UnevenSampler(41, seed=0)
    t.load_state_dict(s.state_dict())
    assert np.array_equal(s.next_indices([6, 2], 0), t.next_indices([6, 2], 0))
    with pytest.raises(ValueError):
        UnevenSampler(40).load_state_dict(s.state_dict())


def test_rejects_negative_or_empty_batches_and_gives_a_rank_that_sits_out_nothing():
    with pytest.raises(ValueError):
        UnevenSampler(10).next_indices([3, -1], 0)
    with pytest.raises(ValueError):
        UnevenSampler(10).next_indices([0, 0], 0)
    s = UnevenSampler(10, seed=3)
    assert s.slice_at(s.position, [3, 0, 2], 1)[0].size == 0  # rank 1 sits out: its slice is empty
    # the others read the same 5 samples as a split over every rank would
    assert s.slice_at(s.position, [3, 0, 2], 2)[0].tolist() == s.global_batch(5)[3:].tolist()


def test_len_of_an_epoch_counts_the_global_batches_that_start_in_it():
    # 4000 samples in global batches of 128: 32 start in epoch 0, the last crossing 96 samples
    # into epoch 1, in which 31 start
    assert updates_left(4000, 0, 128) == 32 and updates_left(4000, 96, 128) == 31
    sampler, starts = UnevenSampler(4000, seed=1), {0: 0, 1: 0}
    for _ in range(63):
        starts[sampler.epoch] += 1
        sampler.advance(128)
    assert starts == {0: 32, 1: 31} and sampler.epoch == 2
    # a rank's share of an epoch, as DistributedSampler's ceil(N / size) for even batches
    assert epoch_share(4000, [32, 32, 32, 32], 1) == 1000 and epoch_share(4001, [1, 1, 1], 0) == 1334
    assert epoch_share(4000, [83, 81, 82, 10], 3) == 157  # ceil(4000 * 10 / 256)


def test_with_lengths_a_rank_gets_the_same_samples_shortest_first_and_the_tokens_add_up():
    lengths = np.array([5, 1, 9, 3, 3, 7, 2, 8, 6, 4, 1, 2, 9])
    plain = UnevenSampler(len(lengths), seed=4)
    sized = UnevenSampler(len(lengths), seed=4, lengths=lengths)
    sizes = [3, 5, 2, 4]
    start = sized.position.advanced(7, len(lengths))  # a global batch that crosses the epoch's end
    totals = []
    for rank in range(4):
        idx, epochs = sized.slice_at(start, sizes, rank)
        ref, ref_epochs = plain.slice_at(start, sizes, rank)
        assert sorted(zip(idx, epochs)) == sorted(zip(ref, ref_epochs))
        assert list(lengths[idx]) == sorted(lengths[ref])
        total, mine = sized.tokens_at(start, sizes, rank)
        assert mine == lengths[idx].sum()
        totals.append((total, mine))
    assert len({t for t, _ in totals}) == 1 and sum(m for _, m in totals) == totals[0][0]
