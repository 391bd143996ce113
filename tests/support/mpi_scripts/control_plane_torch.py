"""The control plane over torch.distributed (TorchComm on a Gloo group), under torchrun.

Every call of the ControlComm interface with known values (rank r sends r, or a dict of r), then
ControlPlane.rebalance with the paper's strategy on known reports, checked against the closed
form every rank computes itself, and a Balancer that rebalances every 2 updates. One JSON file
per rank in OUT_DIR.
"""

import json
import os
import sys
import time

import torch.distributed as dist

from bno_hvd.allocation import make_strategy
from bno_hvd.allocation.paper import bno_batch_sizes
from bno_hvd.library.balancer import Balancer
from bno_hvd.library.control.plane import ControlPlane, RankReport
from bno_hvd.processes.torchcomm import SLOT
from bno_hvd.processes.torchenv import world_control_comm

dist.init_process_group("gloo")
comm = world_control_comm()  # no MPI launcher: a TorchComm
rank, size = comm.Get_rank(), comm.Get_size()
failures = []


def check(what, got, expected):
    if got != expected:
        failures.append(f"{what}: {got!r} != {expected!r}")


check("kind", type(comm).__name__, "TorchComm")
check("rank", rank, int(os.environ["RANK"]))
check("size", size, int(os.environ["WORLD_SIZE"]))
root = size - 1  # a root other than 0 where there are several ranks
check("bcast", comm.bcast({"from": rank} if rank == root else None, root=root), {"from": root})
gathered = comm.gather(("rank", rank), root=root)
check("gather", gathered, [("rank", r) for r in range(size)] if rank == root else None)
# longer than a slot of the fixed-size collectives (TorchComm.SLOT): the rest travels apart, on odd ranks
big = {r: bytes([r % 251]) * (3 * SLOT + r) if r % 2 else ("small", r) for r in range(size)}
gathered = comm.gather(big[rank], root=root)
check("gather long", gathered, [big[r] for r in range(size)] if rank == root else None)
check("bcast long", comm.bcast(big[root] if rank == root else None, root=root), big[root])
for n in (SLOT - 26, SLOT - 25):  # pickled: the slot's last byte after the 8-byte length; one more
    check(f"bcast {n}", comm.bcast(b"x" * n if rank == 0 else None), b"x" * n)
check("allgather", comm.allgather(rank * 10), [r * 10 for r in range(size)])
check("scatter", comm.scatter([f"to {r}" for r in range(size)] if rank == 0 else None, root=0), f"to {rank}")
if size > 1:  # a ring of point-to-point messages, in order
    if rank == 0:
        comm.send([0, "first"], dest=1)
        comm.send([0, "second"], dest=1)
        check("recv", comm.recv(source=size - 1), [size - 1])
    else:
        got = [comm.recv(source=rank - 1)]
        if rank == 1:
            got.append(comm.recv(source=0))
        comm.send([rank], dest=(rank + 1) % size)
        check("recv", got, [[0, "first"], [0, "second"]] if rank == 1 else [[rank - 1]])
request = comm.Ibarrier()
while not request.Test():
    pass
comm.Barrier()
twin = comm.Dup()  # its own group: the same ranks
check(
    "dup",
    (type(twin).__name__, twin.Get_rank(), twin.Get_size(), twin.allgather(rank)),
    ("TorchComm", rank, size, list(range(size))),
)

# gather -> the paper's allocation on rank 0 -> broadcast, against the closed form
lat = [[0.0 if i == j else 1e-4 * (1 + i + j) for j in range(size)] for i in range(size)]
report = RankReport(rank, 100.0 * (rank + 1), 1e6 * (rank + 1), lat[rank], [(32, 0.32 / (rank + 1))])
result = ControlPlane(comm).rebalance(make_strategy("bno", size, 32), report, [32] * size, update=10)
expected = bno_batch_sizes([100.0 * (r + 1) for r in range(size)], [1e6 * (r + 1) for r in range(size)], lat, 32)
check("bno", result.batch_sizes, expected)

# a Balancer over it: every rank uses the same splits, re-split every 2 updates
bal = Balancer(comm, make_strategy("random", size, 8, seed=3), 1000, rebalance_every=2)
splits = []
for _ in range(8):
    step = bal.start_step()
    time.sleep(0.002)  # a measurable compute phase (non-finite metrics would keep the split)
    bal.end_compute()
    bal.end_step()
    splits.append(step.batch_sizes)
everyone = comm.allgather(splits)
check("splits agree", all(s == splits for s in everyone), True)
check("split changed", size == 1 or len({tuple(s) for s in splits}) > 1, True)

with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as fh:
    json.dump({"rank": rank, "size": size, "failures": failures, "sizes": result.batch_sizes}, fh)
dist.destroy_process_group()
sys.exit(1 if failures else 0)
