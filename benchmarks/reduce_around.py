"""A ring allreduce of the CNN's gradient size against a reduction around the starved rank, under
real CPU quotas (root, cgroup v1 or v2).

ring: one Horovod allreduce over all 4 ranks. around: rank 3 (the starved one) and rank 0 sum
their gradients (process set {0,3}), ranks 0-2 allreduce that (set {0,1,2}), and rank 0 sends
the result back to rank 3: rank 3 takes part in two small collectives instead of the ring's six
steps. Prints each rank's median wall and CPU (all threads) per reduction, twice in turn.

    horovodrun -np 4 -H localhost:4 --mpi python benchmarks/reduce_around.py
"""

import argparse
import statistics
import time

import horovod.torch as hvd
import torch
from mpi4py import MPI

from bno_hvd.common.parsing import RankSchedule
from bno_hvd.lab.cpuquota import CpuQuotaHook, parse_quotas
from bno_hvd.processes.collectives import wait_handles
from bno_hvd.processes.gloo import init_gloo_env

CNN_PARAMETERS = 215_370  # bno-hvd's baseline CNN on 28x28 images


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quotas", default="0.5,0.5,0.5,0.17", help="share of one core per rank (4 ranks)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    quotas = parse_quotas(args.quotas)
    init_gloo_env(MPI.COMM_WORLD)
    fast, pair = hvd.ProcessSet([0, 1, 2]), hvd.ProcessSet([0, 3])
    hvd.init(process_sets=[fast, pair])
    if hvd.size() != 4:
        raise SystemExit("reduce_around.py: run it on exactly 4 ranks")
    rank = hvd.rank()
    quota = CpuQuotaHook(RankSchedule.constant(quotas), rank)  # what --cpu-quota does, reaper included
    quota.start(None)
    try:
        run(rank, fast, pair, args.repeats)
    finally:
        quota.close()


def run(rank, fast, pair, repeats) -> None:
    grad = torch.ones(CNN_PARAMETERS)

    def done(handle):
        wait_handles(hvd, [handle])
        return hvd.synchronize(handle)

    def ring():
        return done(hvd.allreduce_async(grad, op=hvd.Sum, name="ring"))

    def around():
        total = grad
        if rank in (0, 3):
            total = done(hvd.allreduce_async(grad, op=hvd.Sum, name="pair", process_set=pair))
        if rank in (0, 1, 2):
            total = done(hvd.allreduce_async(total, op=hvd.Sum, name="fast", process_set=fast))
        if rank in (0, 3):
            total = done(hvd.broadcast_async(total, root_rank=0, name="back", process_set=pair))
        return total

    for name, reduce in (("ring", ring), ("around", around), ("ring", ring), ("around", around)):
        assert float(reduce()[0]) == 4.0  # every rank holds the sum of all four
        walls, cpus = [], []
        for i in range(repeats + 3):
            cpu, wall = time.process_time(), time.perf_counter()
            reduce()
            if i >= 3:
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
        rows = MPI.COMM_WORLD.gather((statistics.median(walls), statistics.median(cpus)), root=0)
        if rank == 0:
            wall_ms = ", ".join(f"{1e3 * w:.1f}" for w, _ in rows)
            cpu_ms = ", ".join(f"{1e3 * c:.2f}" for _, c in rows)
            print(f"{name:<7} wall ms per rank {wall_ms}; CPU ms per rank {cpu_ms}", flush=True)


if __name__ == "__main__":
    main()
