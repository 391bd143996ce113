"""The DataLoader path without MPI: the allocation plan (lag D), the batch sampler's epochs and
look-ahead, per-sample seeding of augmentation, and errors, through real torch DataLoaders with
worker processes. The multi-rank versions are in test_loader_ranks.py."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from bno_hvd.allocation.plan import AllocationPlan, LagError
from bno_hvd.allocation.sampler import UnevenSampler, epoch_permutation
from bno_hvd.common.errors import UsageError
from bno_hvd.library.loader import Batch, CollateToBatch, KeyedDataset, UnevenBatchSampler, prefetch_depth, sample_seed

# -- the plan ---------------------------------------------------------------------------------


def test_a_decision_is_used_lag_updates_later():
    plan = AllocationPlan([4, 4], lag=3)
    assert [plan.sizes(u) for u in range(3)] == [[4, 4]] * 3
    with pytest.raises(LagError, match="update 3 at update 0.*lag D=3.*at least 4"):
        plan.sizes(3)
    plan.finish_update()  # update 0 done
    assert plan.decide([6, 2]) == 3  # decided after update 0: used from 0 + 3
    assert [plan.sizes(u) for u in (1, 2, 3)] == [[4, 4], [4, 4], [6, 2]]
    plan.finish_update()
    plan.finish_update()  # 3 updates done: a decision now is used from 3 + 3 - 1
    assert plan.decide([5, 3]) == 5 and plan.latest() == [5, 3]
    assert [plan.sizes(u) for u in (3, 4, 5)] == [[6, 2], [6, 2], [5, 3]]


def test_lag_one_is_the_next_update_and_state_round_trips():
    plan = AllocationPlan([8, 8])
    plan.finish_update()
    assert plan.decide([10, 6]) == 1 and plan.sizes(1) == [10, 6]
    copy = AllocationPlan([1, 1], lag=1)
    copy.load_state_dict(plan.state_dict())
    assert (copy.done, copy.sizes(1), copy.lag) == (1, [10, 6], 1)


def test_the_lag_is_raised_never_lowered():
    plan = AllocationPlan([4, 4], lag=2)
    plan.raise_lag(5)
    plan.raise_lag(1)
    assert plan.lag == 5 and plan.sizes(4) == [4, 4]


# -- the batch sampler --------------------------------------------------------------------------


def sampler_for(n, sizes, lag=1, seed=0):
    plan = AllocationPlan(sizes, lag=lag)
    stream = UnevenSampler(n, seed=seed)
    return plan, stream


def test_one_iteration_is_one_epoch_and_a_straddling_batch_belongs_where_it_starts():
    plan, stream = sampler_for(10, [2, 2], lag=100)  # global batch 4: updates start at 0, 4, 8 | 2, 6 | 0 ...
    keys = list(UnevenBatchSampler(plan, stream, 0))
    assert [k[0][0] for k in keys] == [0, 1, 2]  # update 2 starts at offset 8 and crosses into epoch 1
    assert [e for _, e, _ in keys[2]] == [0, 0]  # rank 0's part of update 2: the last two of epoch 0
    rank1 = list(UnevenBatchSampler(plan, stream, 1))
    assert [e for _, e, _ in rank1[2]] == [1, 1]  # rank 1's part of update 2: the first two of epoch 1
    assert len(UnevenBatchSampler(plan, stream, 0)) == 3


def test_iteration_starts_at_the_next_update_to_run_not_where_prefetch_stopped():
    plan, stream = sampler_for(40, [3, 5], lag=10)
    ahead = iter(UnevenBatchSampler(plan, stream, 1))
    fetched = [next(ahead) for _ in range(4)]  # a loader drew 4 batches ahead...
    for _ in range(2):  # ...but only 2 updates were done
        plan.finish_update()
        stream.advance(8)
    again = list(UnevenBatchSampler(plan, stream, 1))
    assert again[0] == fetched[2] and again[1] == fetched[3]


@pytest.mark.slow
def test_a_loader_deeper_than_the_lag_stops_with_a_message_naming_d():
    plan, stream = sampler_for(1000, [2, 2], lag=2)
    keyed = KeyedDataset(torch.utils.data.TensorDataset(torch.arange(1000)), 0, False, fast_tensors=True)
    loader = DataLoader(
        keyed,
        batch_sampler=UnevenBatchSampler(plan, stream, 0),
        collate_fn=CollateToBatch(),
        num_workers=1,
        prefetch_factor=2,
    )  # reads 2 ahead: needs D >= 3
    with pytest.raises(LagError, match="lag D=2"):
        next(iter(loader))
    assert prefetch_depth(1, 2) == 2 and prefetch_depth(0, None) == 0 and prefetch_depth(3, None) == 6


class Indexed(Dataset):
    """Sample i is (i, a random draw): which sample, and what an augmentation drew for it."""

    def __len__(self):
        return 57

    def __getitem__(self, i):
        return torch.tensor(i), torch.rand(1)


def run_loader(sizes_per_update, rank, workers, persistent, n_updates, seed=3):
    """This rank's batches through a real DataLoader; allocations change as ``sizes_per_update`` says."""
    plan = AllocationPlan(sizes_per_update(0), lag=prefetch_depth(workers, 2) + 1)
    stream = UnevenSampler(57, seed=seed)
    keyed = KeyedDataset(Indexed(), seed, seed_samples=True, fast_tensors=False)
    kwargs = {"num_workers": workers, "persistent_workers": persistent, "prefetch_factor": 2} if workers else {}
    loader = DataLoader(
        keyed, batch_sampler=UnevenBatchSampler(plan, stream, rank), collate_fn=CollateToBatch(), **kwargs
    )
    seen = []
    while plan.done < n_updates:
        for batch in loader:
            assert batch.update == plan.done and batch.error is None
            assert batch.size == plan.sizes(plan.done)[rank]
            _, epochs = stream.slice_at(stream.position, plan.sizes(plan.done), rank)
            seen.append(
                (
                    batch.update,
                    batch.data[0].tolist(),
                    batch.data[1].flatten().tolist(),
                    epochs.tolist(),
                    plan.sizes(plan.done),
                )
            )
            stream.advance(sum(plan.sizes(plan.done)))
            plan.finish_update()
            if plan.done % 2 == 0:
                plan.decide(sizes_per_update(plan.done))
            if plan.done == n_updates:
                break
    return seen


def changing(update):
    rng = np.random.default_rng(update)
    return [int(x) for x in rng.integers(1, 6, size=3)]


@pytest.mark.parametrize(
    "workers,persistent",
    [(0, False), pytest.param(2, False, marks=pytest.mark.slow), pytest.param(2, True, marks=pytest.mark.slow)],
)
def test_every_sample_once_per_epoch_with_workers_and_changing_allocations(workers, persistent):
    ranks = [run_loader(changing, r, workers, persistent, n_updates=60) for r in range(3)]
    stream = []
    for u in range(60):  # every rank saw update u; together they hold the global batch in rank order
        parts = [next(s for s in seen if s[0] == u) for seen in ranks]
        assert all(p[4] == parts[0][4] for p in parts)  # every rank ran update u with the same sizes
        assert [len(p[1]) for p in parts] == parts[0][4]
        stream += [i for p in parts for i in p[1]]
    expected = np.concatenate([epoch_permutation(57, 3, e) for e in range(len(stream) // 57 + 1)])
    assert stream == expected[: len(stream)].tolist()  # the stream of seed 3, exactly, whatever the split
    assert len(stream) // 57 >= 3
    assert len({tuple(p[4]) for seen in ranks for p in seen}) > 5  # the allocation really changed


@pytest.mark.slow
def test_augmentation_depends_on_the_sample_and_epoch_only():
    alone = run_loader(lambda u: [12], 0, workers=0, persistent=False, n_updates=20)
    split = [run_loader(changing, r, workers=2, persistent=True, n_updates=40) for r in range(3)]
    draws_alone = {(e, i): d for _, idx, draw, epochs, _ in alone for i, d, e in zip(idx, draw, epochs)}
    checked = 0
    for seen in split:
        for _, idx, draw, epochs, _ in seen:
            for i, d, e in zip(idx, draw, epochs):
                if (e, i) in draws_alone:  # the same random draw for the same sample in the same epoch
                    assert d == draws_alone[(e, i)]
                    checked += 1
    assert checked > 150
    assert len({d for d in draws_alone.values()}) > 0.9 * len(draws_alone)  # and different draws otherwise
    assert sample_seed(0, 0, 1) != sample_seed(0, 0, 2) != sample_seed(0, 1, 1)


class Drawing(Dataset):
    """Sample i draws from the generators named (a numpy augmentation, Python's random, ...)."""

    def __init__(self, *draws):
        self.draws = draws

    def __len__(self):
        return 20

    def __getitem__(self, i):
        return i, tuple(draw() for draw in self.draws)


def test_only_the_generators_a_dataset_draws_from_are_seeded_and_each_draw_follows_its_sample():
    import random

    import numpy as np

    cases = {
        (): (),
        ("numpy",): (np.random.rand,),
        ("random",): (random.random,),
        ("torch",): (lambda: float(torch.rand(1)),),
    }
    for names, draws in cases.items():
        keyed = KeyedDataset(Drawing(*draws), 0, seed_samples=True, fast_tensors=False)
        first = keyed.__getitems__([(0, 0, 3), (0, 0, 4)]).samples  # the first batch: which generators moved
        assert keyed.drawn_from == names, (names, keyed.drawn_from)
        again = keyed.__getitems__([(1, 0, 4), (1, 0, 3)]).samples  # seeded alike, in another batch and order
        assert dict(first) == dict(again) and (not draws or first[0][1] != first[1][1])
    assert KeyedDataset(Drawing(np.random.rand), 0, seed_samples=False, fast_tensors=False).drawn_from == ()


def test_the_training_process_random_state_is_left_alone():
    keyed = KeyedDataset(Indexed(), 0, seed_samples=True, fast_tensors=False)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    keyed.__getitems__([(0, 0, 1), (0, 0, 2)])
    assert torch.equal(torch.rand(3), expected)


class Broken(Dataset):
    samples = [(f"/data/img{i}.png", 0) for i in range(10)]  # ImageFolder-like: names the file

    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 7:
            raise OSError("image file is truncated")
        return torch.zeros(1)


def test_an_unreadable_sample_becomes_one_line_naming_the_file():
    fetched = KeyedDataset(Broken(), 0, seed_samples=False, fast_tensors=False).__getitems__([(4, 0, 6), (4, 0, 7)])
    batch = CollateToBatch()(fetched)
    assert isinstance(batch, Batch) and batch.update == 4 and batch.data is None
    assert "/data/img7.png" in batch.error and "truncated" in batch.error and "\n" not in batch.error


def test_loader_options_that_belong_to_the_balancer_are_refused():
    from bno_hvd.library.loader import make_loader

    class FakeBalancer:  # only what make_loader reads before its collective
        rank = 0

    for kwargs, words in [
        ({"batch_size": 8}, "batch_size"),
        ({"shuffle": True}, "shuffle"),
        ({"in_order": False}, "in_order=False"),
        ({"num_workers": -1}, "num_workers"),
        ({"num_workers": 2, "prefetch_factor": 0}, "prefetch_factor"),
    ]:
        with pytest.raises(UsageError, match=words):
            make_loader(FakeBalancer(), Indexed(), **kwargs)
