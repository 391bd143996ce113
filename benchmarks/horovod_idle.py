"""What Horovod's background loop costs a rank that does nothing (REAL, under a CPU quota).

Every rank starts MPI and Horovod the way bno-hvd does (``bno_hvd.processes.world.init_world``), does one
allreduce, sleeps, and prints the CPU its process used while asleep as a share of one core. Horovod
negotiates once per cycle (``HOROVOD_CYCLE_TIME``, 1 ms by default) even with nothing to reduce,
and on a rank with a CPU quota that CPU comes out of the same budget as the model's.

    horovodrun -np 4 -H localhost:4 --mpi python benchmarks/horovod_idle.py --collectives gloo
"""

import argparse
import os
import time

import torch

from bno_hvd.processes.world import init_world


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collectives", choices=("mpi", "gloo"), default="gloo")
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    world = init_world(args.collectives)
    world.hvd.allreduce(torch.zeros(1), name="idle.start")
    cpu, wall = time.process_time(), time.perf_counter()
    time.sleep(args.seconds)
    share = (time.process_time() - cpu) / (time.perf_counter() - wall)
    shares = world.control_comm.gather(share, root=0)
    world.hvd.allreduce(torch.zeros(1), name="idle.end")
    if world.master:
        cycle = os.environ.get("HOROVOD_CYCLE_TIME", "1 (default)")
        print(
            f"{args.collectives}, HOROVOD_CYCLE_TIME={cycle} ms: idle CPU per rank "
            + ", ".join(f"{s:.3f}" for s in shares)
            + " of a core",
            flush=True,
        )


if __name__ == "__main__":
    main()
