"""Each rank reads its batches through Balancer.loader (real DataLoader, 2 workers) while a
`random` allocation changes every 2 updates; writes what it saw for the test to check.

    mpirun -np 4 python tests/support/mpi_scripts/loader_coverage.py OUT_DIR MODE...
MODE: persistent (one loader, persistent workers, epoch after epoch), recreate (a new loader
every epoch), batches (Balancer.batches over a fixed number of updates). One job runs every
MODE given, one after another, each with a Balancer of its own (a job's start-up costs more
than a mode's run); each rank writes OUT_DIR/MODE-rankR.json.
"""

import json
import sys

import torch
from mpi4py import MPI
from torch.utils.data import Dataset

from bno_hvd import Balancer, make_strategy

N, UPDATES, SEED = 103, 45, 11  # 103 samples, global batch 4 ranks x 4 = 16: epochs end inside batches


class Indexed(Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.tensor(i)


def run(mode):
    """One mode's run on a Balancer of its own; returns its lag and what this rank saw."""
    bal = Balancer(comm, make_strategy("random", size, 4, seed=SEED), N, seed=SEED, rebalance_every=2)
    loader_args = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": mode == "persistent"}
    seen = []

    def consume(batch, epoch):
        step = bal.start_step(batch)
        seen.append(
            {
                "update": step.update,
                "epoch": epoch,
                "sizes": step.batch_sizes,
                "weight": step.weight,
                "indices": batch.data.tolist(),
            }
        )
        bal.end_compute()
        bal.end_step()

    if mode == "batches":
        for batch in bal.batches(bal.loader(Indexed(), **loader_args), UPDATES):
            consume(batch, None)
    else:
        loader = bal.loader(Indexed(), **loader_args)
        epoch = 0
        while bal.update < UPDATES:
            if mode == "recreate" and epoch > 0:
                loader = bal.loader(Indexed(), **loader_args)
            for batch in loader:
                consume(batch, epoch)
                if bal.update == UPDATES:
                    break
            epoch += 1
    return bal.plan.lag, seen


out_dir, *modes = sys.argv[1:]
comm = MPI.COMM_WORLD.Dup()
rank, size = comm.Get_rank(), comm.Get_size()
torch.set_num_threads(1)
for mode in modes:
    lag, seen = run(mode)
    with open(f"{out_dir}/{mode}-rank{rank}.json", "w") as fh:
        json.dump({"rank": rank, "lag": lag, "seen": seen}, fh)
    comm.Barrier()
