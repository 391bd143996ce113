"""What Horovod's background loop costs a rank (REAL, under a CPU quota): idle, and per allreduce.

Every rank starts MPI and Horovod the way bno-hvd does (``bno_hvd.processes.world.init_world``), does one
allreduce, sleeps, and prints the CPU its process used while asleep as a share of one core; then the
time of ``--allreduces`` allreduces of the ``cnn`` model's gradient (0.2 M floats). Horovod
negotiates once per cycle (``HOROVOD_CYCLE_TIME``, 1 ms by default) even with nothing to reduce,
and on a rank with a CPU quota that CPU comes out of the same budget as the model's.
``--dynamic-sets``: Horovod started with ``process_sets="dynamic"`` instead of bno-hvd's static
sets (why bno-hvd does not: :mod:`bno_hvd.processes.sitsets`).

    horovodrun -np 4 -H localhost:4 --mpi python benchmarks/horovod_idle.py --collectives gloo
    horovodrun -np 4 -H localhost:4 --mpi python benchmarks/horovod_idle.py --collectives gloo --dynamic-sets
"""

import argparse
import os
import time

import horovod.torch
import torch

from bno_hvd.data.models import build_model
from bno_hvd.processes.world import init_world


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collectives", choices=("mpi", "gloo"), default="gloo")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--allreduces", type=int, default=200)
    ap.add_argument("--dynamic-sets", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.dynamic_sets:
        start = horovod.torch.init
        horovod.torch.init = lambda process_sets=None, **kw: start(process_sets="dynamic", **kw)
    world = init_world(args.collectives)
    world.hvd.allreduce(torch.zeros(1), name="idle.start")
    cpu, wall = time.process_time(), time.perf_counter()
    time.sleep(args.seconds)
    share = (time.process_time() - cpu) / (time.perf_counter() - wall)
    grad = torch.randn(sum(p.numel() for p in build_model("cnn").parameters()))
    for _ in range(10):
        world.hvd.allreduce(grad, name="warm")
    world.control_comm.Barrier()
    wall = time.perf_counter()
    for _ in range(args.allreduces):
        world.hvd.allreduce(grad, name="grad")
    ms = (time.perf_counter() - wall) / max(args.allreduces, 1) * 1e3
    shares, times = world.control_comm.gather(share, root=0), world.control_comm.gather(ms, root=0)
    if world.master:
        cycle = os.environ.get("HOROVOD_CYCLE_TIME", "1 (default)")
        sets = "dynamic process sets" if args.dynamic_sets else "static process sets"
        print(
            f"{args.collectives}, {sets}, HOROVOD_CYCLE_TIME={cycle} ms: idle CPU per rank "
            + ", ".join(f"{s:.3f}" for s in shares)
            + f" of a core; an allreduce of {grad.numel()} floats {max(times):.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
