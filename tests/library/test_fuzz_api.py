"""The library's public API fuzzed with Hypothesis: ``make_strategy``, ``Balancer`` (and the calls a
loop makes on it), ``Balancer.for_world``, ``bno_hvd.DataLoader``, ``bno_hvd.DistributedOptimizer``
and ``exact_dropout``; their argument tables and calls are in ``support/fuzz_api.py``.

The property is the CLI's (``support/fuzz_property.py``): for anything a caller can pass, a valid
result or a :class:`UsageError` whose message is one line; no other exception, no warning, no
hang. The calls run in this process in a world of one rank (``MPI.COMM_SELF``; Horovod is
initialised once, as a script's ``hvd.init()`` does). That every rank of a real job raises the
same line is ``test_api_errors_ranks.py`` (mpirun).

Budget: :data:`EXAMPLES` calls per entry point, drawn :data:`PER_EXAMPLE` to a Hypothesis example
(its bookkeeping per example costs more than most calls), with a fixed seed and no example
database; with ``BNO_FUZZ_EXAMPLES=N`` (the long run) at least N / 6 per entry point, with a
random seed. A failure shrinks to one call.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import fuzz_api as fa
from support import fuzz_api_model as fm
from support.fuzz_property import result_or_one_line

EXAMPLES = 10_000  # calls per entry point, in every run of the suite
PER_EXAMPLE = 10
# entry point -> (its argument table, its run, bytes of calls drawn after the arguments)
ENTRY_POINTS = {
    "make_strategy": (fa.STRATEGY, fa.run_make_strategy, 0),
    "Balancer": (fa.BALANCER, fa.run_balancer, 16),
    "Balancer.for_world": (fa.FOR_WORLD, fa.run_for_world, 0),
    "DataLoader": (fa.LOADER, fa.run_data_loader, 0),
    "DistributedOptimizer": (fm.OPTIMIZER, fm.run_optimizer, 0),
    "exact_dropout": (fm.DROPOUT, fm.run_exact_dropout, 0),
}


@dataclass
class World:
    comm: object  # MPI.COMM_SELF
    hvd: object  # horovod.torch, initialised


@pytest.fixture(scope="module")
def world():
    import horovod.torch as hvd
    import torch
    from mpi4py import MPI

    hvd.init()  # a world of one rank, as a script's hvd.init() under a 1-process launch
    threads, hook = torch.get_num_threads(), sys.excepthook
    torch.set_num_threads(1)
    yield World(MPI.COMM_SELF, hvd)
    sys.excepthook = hook  # the drop-in's one-line hook, installed by for_world and DataLoader
    torch.set_num_threads(threads)


def examples() -> int:
    total = os.environ.get("BNO_FUZZ_EXAMPLES")
    return max(EXAMPLES, int(total) // len(ENTRY_POINTS)) if total else EXAMPLES


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_fuzz_api(entry, world):
    table, run, call_bytes = ENTRY_POINTS[entry]
    width = len(table) + call_bytes
    counts = {"results": 0, "refused": 0}
    started = time.monotonic()

    def one(data: bytes):
        args = fa.decode(table, data)
        call = (lambda: run(args, world, data[len(table) :])) if call_bytes else (lambda: run(args, world))
        counts["refused" if result_or_one_line(call) is None else "results"] += 1

    @settings(
        max_examples=examples() // PER_EXAMPLE,
        deadline=None,
        database=None,
        derandomize=not os.environ.get("BNO_FUZZ_EXAMPLES"),
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(st.binary(min_size=width, max_size=width), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
    def holds(calls):
        for data in calls:
            one(data)

    holds()
    total = sum(counts.values())
    print(f"fuzz api {entry}: {total} calls ({counts['results']} results, {counts['refused']} refused) "
          f"in {time.monotonic() - started:.0f} s")  # fmt: skip
    assert total >= examples(), f"Hypothesis ran out of inputs after {total} calls"
    assert counts["results"] >= total // 10 and counts["refused"] >= total // 10, counts  # both sides, often
