"""Rank r holds r+1 samples of value r. The sample-weighted Horovod Sum-allreduce of the
local means must equal sum r(r+1) / sum (r+1), computed locally in closed form."""

import sys

import horovod.torch as hvd
import torch
from mpi4py import MPI  # noqa: F401

from bno_hvd.allocation.weighting import rank_weight

hvd.init()
rank, size = hvd.rank(), hvd.size()
sizes = [r + 1 for r in range(size)]
local = torch.full((rank + 1, 3), float(rank), dtype=torch.float64)
got = hvd.allreduce(local.mean(0) * rank_weight(sizes, rank), op=hvd.Sum, name="weighted")
expected = sum(r * (r + 1) for r in range(size)) / sum(r + 1 for r in range(size))
plain = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Average, name="plain")
ok = torch.allclose(got, torch.full((3,), expected, dtype=torch.float64), rtol=0, atol=1e-12)
ok = ok and abs(plain.item() - (size - 1) / 2) < 1e-6
print(f"rank {rank}/{size}: weighted={got.tolist()} expected={expected} plain={plain.item()} ok={ok}", flush=True)
sys.exit(0 if ok else 1)
