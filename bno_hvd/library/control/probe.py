"""``bno-hvd probe``: measure every rank once (throughput, memory, latency row) and assemble the
cluster's :class:`~bno_hvd.allocation.ClusterMetrics` on rank 0, for ``bno-hvd allocate``.

Usage (every rank; rank 0 gets the metrics)::

    metrics, probe_seconds = probe_cluster(comm, model, batch_size=32, steps=20)
"""

from __future__ import annotations

import time

import numpy as np

from bno_hvd.allocation import ClusterMetrics
from bno_hvd.library.control.latency import measure_latency_row
from bno_hvd.library.control.monitor import process_memory_bytes
from bno_hvd.library.control.schedule import complete_matrix


def time_steps(model, input_shape, batch_size: int, steps: int) -> float:
    """Samples/s of ``steps`` forward+backward passes on random data (after one warm-up)."""
    import torch
    import torch.nn.functional as F

    x, y = torch.randn(batch_size, *input_shape), torch.randint(0, 10, (batch_size,))
    F.cross_entropy(model(x), y).backward()  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
    return steps * batch_size / (time.perf_counter() - t0)


def probe_cluster(
    comm,
    model,
    *,
    input_shape=(1, 28, 28),
    batch_size: int = 32,
    steps: int = 20,
    probe_bytes: int = 65536,
    repeats: int = 5,
    max_rounds: int | None = None,
):
    """Collective over ``comm``: rank 0 returns (ClusterMetrics, probe seconds per rank); others (None, None)."""
    ops = time_steps(model, input_shape, batch_size, steps)
    t0 = time.perf_counter()
    row = measure_latency_row(comm, payload_bytes=probe_bytes, repeats=repeats, max_rounds=max_rounds)
    probe_seconds = time.perf_counter() - t0
    gathered = comm.gather((row.tolist(), ops, process_memory_bytes(), probe_seconds), root=0)
    if comm.Get_rank() != 0:
        return None, None
    rows, ops_all, memory, seconds = zip(*gathered)
    latency = complete_matrix(np.array(rows))
    return ClusterMetrics(ops=list(ops_all), memory_used=list(memory), latency=latency.tolist()), list(seconds)
