"""The Balancer with token sequences in one process (an MPI world of 1): token weights, shares of
work cut into sequences, micro-batches under a token cap, and the cost model kept in its state."""

import numpy as np
import pytest
from mpi4py import MPI

from bno_hvd import Balancer, TextOptions, make_strategy
from bno_hvd.allocation.costmodel import UNITS, SequenceCost, work_per_sequence

LENGTHS = np.random.default_rng(3).integers(1, 30, 50)


def balancer(cost, **kw):
    return Balancer(
        MPI.COMM_SELF,
        make_strategy("equal", 1, 4 * UNITS),
        len(LENGTHS),
        seed=2,
        text=TextOptions(lengths=LENGTHS, work=work_per_sequence(LENGTHS, cost), cost=cost, **kw),
    )


def test_a_step_of_a_global_batch_in_tokens():
    bal = balancer(SequenceCost(0.0, 1.0, 0.0), shares=True, global_tokens=100, max_tokens=40)
    for _ in range(5):
        step = bal.start_step()
        lengths = LENGTHS[step.indices]
        assert step.weight == 1.0 and step.global_tokens == lengths.sum() >= 100
        assert list(step.lengths) == sorted(lengths) and step.batch_sizes == [len(lengths)]
        assert step.work == pytest.approx(work_per_sequence(LENGTHS, SequenceCost(0, 1, 0))[step.indices].sum(), abs=1)
        parts = list(step.parts())
        assert step.micro_batches == len(parts) >= 2
        assert sum(share for _, share in parts) == pytest.approx(1.0)
        for part, _ in parts:
            assert len(step.lengths[part]) * max(step.lengths[part]) <= 40
        bal.end_compute()
        bal.end_step()


def test_a_resumed_balancer_splits_by_the_cost_it_saved():
    saved = SequenceCost(1e-4, 2e-5, 3e-7)
    first = balancer(saved, shares=True, global_count=8)
    first.start_step()
    first.end_compute()
    first.end_step()
    state = first.state_dict()
    resumed = balancer(SequenceCost(1.0, 0.0, 0.0), shares=True, global_count=8)  # a new measurement
    resumed.load_state_dict(state)
    assert resumed.cost == saved and np.allclose(resumed.sampler.work, first.sampler.work)
    assert resumed.update == 1 and resumed.sampler.position == first.sampler.position
