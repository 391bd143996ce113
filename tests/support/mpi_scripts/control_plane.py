"""Gather/broadcast through the control plane, and a measured latency matrix.

Each rank reports known numbers (ops = 100 (r+1)); every rank recomputes the expected
allocation locally from the same closed-form inputs and checks what rank 0 broadcast.
"""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from bno_hvd.allocation import make_strategy
from bno_hvd.allocation.paper import bno_batch_sizes
from bno_hvd.library.control.latency import measure_latency_row
from bno_hvd.library.control.monitor import MetricsMonitor
from bno_hvd.library.control.plane import ControlPlane, RankReport

comm = MPI.COMM_WORLD.Dup()
rank, size = comm.Get_rank(), comm.Get_size()
failures = []

# 1. latency matrix, measured
row = measure_latency_row(comm, payload_bytes=4096, repeats=3)
rows = comm.allgather(row.tolist())
lat = np.array(rows)
if lat.shape != (size, size):
    failures.append(f"shape {lat.shape}")
if not np.all(np.diag(lat) == 0):
    failures.append("diagonal not zero")
off = lat[~np.eye(size, dtype=bool)]
if size > 1 and not (np.all(np.isfinite(off)) and np.all(off > 0)):
    failures.append(f"off-diagonal not positive finite: {off}")

# 2. gather -> bno on rank 0 -> broadcast
report = RankReport(
    rank=rank,
    ops=100.0 * (rank + 1),
    memory_used=1e6 * (rank + 1),
    latency_row=lat[rank].tolist(),
    compute_samples=[(32, 0.32 / (rank + 1))],
)
plane = ControlPlane(comm)
strategy = make_strategy("bno", size, 32)
result = plane.rebalance(strategy, report, [32] * size, update=10)
sym = (lat + lat.T) / 2  # what rank 0 sees after completing the matrix
expected = bno_batch_sizes(
    [100.0 * (r + 1) for r in range(size)], [1e6 * (r + 1) for r in range(size)], sym.tolist(), 32
)
if result.batch_sizes != expected:
    failures.append(f"bno broadcast {result.batch_sizes} != expected {expected}")

# 3. a rank with a non-finite metric does not poison the allocation
bad = RankReport(
    rank=rank, ops=float("nan") if rank == size - 1 else 50.0, memory_used=1.0, latency_row=lat[rank].tolist()
)
kept = plane.rebalance(make_strategy("bno", size, 32), bad, [7] * size, update=20)
if kept.batch_sizes != [7] * size:
    failures.append(f"non-finite metrics changed the allocation: {kept.batch_sizes}")
if rank == 0 and size > 1 and not kept.warnings:
    failures.append("no warning for non-finite metrics")

# 4. the background monitor probes latency and stops collectively
mon = MetricsMonitor(MPI.COMM_WORLD.Dup(), latency_interval=0.3, payload_bytes=1024).start()
deadline = time.time() + 20
while size > 1 and np.isnan(mon.latest_row()).any() and time.time() < deadline:
    time.sleep(0.05)
mon.stop()
if size > 1 and np.isnan(mon.latest_row()).any():
    failures.append(f"monitor never measured latency: {mon.latest_row()} error={mon.error}")
if mon.memory_used <= 0:
    failures.append("monitor memory not measured")

record = {
    "rank": rank,
    "size": size,
    "sizes": result.batch_sizes,
    "failures": failures,
    "control_seconds": result.seconds,
    "latency_ms": (lat[rank] * 1e3).tolist(),
}
# one file per rank: mpirun may interleave the ranks' stdout lines
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as fh:
    json.dump(record, fh)
comm.Barrier()
sys.exit(1 if failures else 0)
