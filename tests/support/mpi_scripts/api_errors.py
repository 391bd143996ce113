"""Bad input to the library in a real job: every rank must raise the same one-line error, none may hang.

``python api_errors.py CASE`` under mpirun: each rank prints what it raised as ``rank R raised
TYPE: MESSAGE``, then lets it end the script as it would a user's (one ``bno-hvd: error:`` line
from rank 0, exit code 2 for a UsageError, 1 for a TrainingError). The cases:

- ``empty``: ``Balancer.for_world([], B)``; ``every-str``: ``rebalance_every="10"`` (each rank finds it);
- ``seven-ranks``: a strategy made for 7 ranks (rank 0 finds it and tells the others);
- ``raises-initial``: a user's strategy whose ``initial()`` raises a KeyError on rank 0;
- ``raises-rebalance``: a user's strategy whose ``rebalance()`` raises a RuntimeError on rank 0
  at the first rebalance, in a drop-in loop (the others are in ``optimizer.step()`` by then).

Rank 0 ends last, ``LATE`` s after it raised, and says so if MPI was finalized under it by then:
a rank that ended first must not shut Horovod (which finalizes MPI on every rank) down under it.
"""

import faulthandler
import sys
import time

import horovod.torch as hvd
import torch
from torch.utils.data import TensorDataset

import bno_hvd as bno
from bno_hvd.allocation import EqualStrategy

LATE = 1.5  # s rank 0 takes to end after it raised (the others end at once)


class Raising(EqualStrategy):
    """A user's strategy with a bug that only rank 0's copy (the one that allocates) runs into."""

    def __init__(self, n_ranks, base_batch_size, where):
        super().__init__(n_ranks, base_batch_size)
        self.where = where

    def initial(self):
        if self.where == "initial":
            raise KeyError("batch")
        return super().initial()

    def rebalance(self, metrics, current, update):
        raise RuntimeError(f"user strategy broke at update {update}")


def run(case):
    hvd.init()
    torch.set_num_threads(1)
    x = torch.linspace(0, 1, 64, dtype=torch.float64).reshape(32, 2)
    data = TensorDataset(x, x.sum(1))
    if case == "empty":
        bno.Balancer.for_world([], 4)
    elif case == "every-str":
        bno.Balancer.for_world(data, 4, rebalance_every="10")
    elif case == "seven-ranks":
        bno.Balancer.for_world(data, 4, bno.make_strategy("equal", 7, 4))
    elif case == "raises-initial":
        bno.Balancer.for_world(data, 4, Raising(hvd.size(), 4, "initial"))
    elif case == "raises-rebalance":
        bal = bno.Balancer.for_world(data, 4, Raising(hvd.size(), 4, "rebalance"), rebalance_every=2)
        model = torch.nn.Linear(2, 1).double()
        opt = bno.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), balancer=bal)
        for _ in range(3):
            for xb, tb in bno.DataLoader(data, sampler=bal):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(xb).reshape(-1), tb).backward()
                opt.step()
    print(f"rank {hvd.rank()}: case {case} was not refused", flush=True)


if __name__ == "__main__":
    # every thread's Python stack on stderr if a rank crashes in native code (rank 0 died of a
    # segfault in raises-rebalance once in three fresh-clone CI runs on 2026-11-28, before it
    # printed its error; 18 repeats here, loaded and not, did not show it again)
    faulthandler.enable(all_threads=True)
    try:
        run(sys.argv[1])
    except Exception as err:
        if hvd.rank() == 0:
            from mpi4py import MPI  # (imported after hvd.init(), as a user's script does: Horovod started MPI)

            time.sleep(LATE)
            if MPI.Is_finalized():
                sys.stdout.write("rank 0: MPI was finalized under it\n")
        sys.stdout.write(f"rank {hvd.rank()} raised {type(err).__name__}: {err}\n")  # one write: one line
        sys.stdout.flush()
        raise
