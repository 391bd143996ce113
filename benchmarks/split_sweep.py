"""Update time against the starved rank's share, under real CPU quotas (root).

Every rank trains the CNN on Fashion-MNIST the way ``bno-hvd train`` does (a weighted loss, Horovod's
``DistributedOptimizer`` with a Sum, the loss allreduced beside the gradients, the allreduce waited
for by polling). The last rank gets ``b`` samples of the global batch and the others share the
rest evenly; ``b`` takes each value of ``--last`` in turn, in blocks of ``--block`` updates, for
``--rounds`` rounds, so slow drifts of a shared machine fall on every ``b`` alike. Prints, per
``b``, the median update time (rank 0's wall clock; every rank ends an update together), each
rank's median compute time, and each rank's CPU in the sync phase, and the split that
equalises compute finish times would choose.

    horovodrun -np 4 -H localhost:4 --mpi python benchmarks/split_sweep.py
"""

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from bno_hvd.common.parsing import RankSchedule, parse_int_list
from bno_hvd.data.images import load_dataset
from bno_hvd.data.models import build_model
from bno_hvd.lab.cpuquota import CpuQuotaHook, parse_quotas
from bno_hvd.processes.collectives import LossSum, wait_for_allreduce
from bno_hvd.processes.world import init_world


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quotas", default="0.5,0.5,0.5,0.17", help="share of one core per rank")
    ap.add_argument("--last", default="1,4,7,10,13", help="samples of the last rank, in turn")
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--block", type=int, default=20, help="updates per block (3 more are not timed)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--collectives", default="gloo", choices=("gloo", "mpi"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    world = init_world(args.collectives)
    quotas = parse_quotas(args.quotas, world.size)
    lasts = parse_int_list(args.last, "--last")
    quota = CpuQuotaHook(RankSchedule.constant(quotas), world.rank)  # what --cpu-quota does
    quota.start(None)
    try:
        sweep(world, lasts, args)
    finally:
        quota.close()


def sizes_for(last: int, total: int, n: int) -> list[int]:
    rest = total - last
    return [rest // (n - 1) + (1 if i < rest % (n - 1) else 0) for i in range(n - 1)] + [last]


def sweep(world, lasts, args) -> None:
    hvd, rank, n = world.hvd, world.rank, world.size
    torch.manual_seed(0)
    model = build_model("cnn")
    data = load_dataset("fashion-mnist", "train")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Sum)
    rng = np.random.default_rng(rank)
    results = {b: [] for b in lasts}  # b -> [(update s, compute s, sync cpu s)] on this rank
    for _ in range(args.rounds):
        for b in lasts:
            sizes = sizes_for(b, args.global_batch, n)
            mine, weight = sizes[rank], sizes[rank] / sum(sizes)
            for i in range(args.block + 3):
                idx = torch.from_numpy(rng.integers(0, len(data), mine))
                x, y = data.tensors[0][idx], data.tensors[1][idx]
                t0 = time.perf_counter()
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y) * weight
                loss.backward()
                t1, c1 = time.perf_counter(), time.process_time()
                total = LossSum(hvd, loss)
                wait_for_allreduce(hvd, opt, [total.handle])
                opt.step()
                total.value()
                t2, c2 = time.perf_counter(), time.process_time()
                if i >= 3:
                    results[b].append((t2 - t0, t1 - t0, c2 - c1))
    rows = world.control_comm.gather({b: np.median(np.array(r), axis=0) for b, r in results.items()}, root=0)
    if rank == 0:
        report(rows, lasts, args.global_batch, n)


def report(rows, lasts, total, n) -> None:
    print(f"REAL: CPU-throttled ranks (cgroup quota); the last rank's samples in turn, {total} in all")
    print("| last rank's samples | sizes | update (ms) | compute ms per rank | sync CPU ms per rank |")
    print("|---|---|---|---|---|")
    for b in lasts:
        update = 1e3 * rows[0][b][0]
        compute = ", ".join(f"{1e3 * r[b][1]:.1f}" for r in rows)
        cpu = ", ".join(f"{1e3 * r[b][2]:.1f}" for r in rows)
        print(f"| {b} | {','.join(map(str, sizes_for(b, total, n)))} | {update:.1f} | {compute} | {cpu} |")
    best = min(lasts, key=lambda b: rows[0][b][0])
    gap = {b: abs(statistics.mean(r[b][1] for r in rows[:-1]) - rows[-1][b][1]) for b in lasts}
    print(f"fastest update: last rank at {best}; closest compute finish times: last rank at {min(gap, key=gap.get)}")


if __name__ == "__main__":
    main()
