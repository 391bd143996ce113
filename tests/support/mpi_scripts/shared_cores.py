"""Each rank starts MPI and Horovod through bno-hvd and prints what it found: the yield setting
Open MPI read at start-up, and the notes start-up arranged."""

import os

from bno_hvd.processes.mpienv import YIELD
from bno_hvd.processes.world import init_world

world = init_world()
print(f"rank {world.rank}: {YIELD}={os.environ.get(YIELD)} notes={len(world.notes)}", flush=True)
