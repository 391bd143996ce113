"""Background sampling of memory (MU_i) and latency (NL_i*), as the paper's step 2 does
"continuously on individual threads".

The latency prober runs on its own duplicated communicator, so its messages never mix with
the control plane's or Horovod's. All ranks' probers wake at the same wall-clock multiples of
``interval`` so that partners meet without long waits.
"""

from __future__ import annotations

import math
import os
import threading
import time

import numpy as np
import psutil

from bno_hvd.library.control.latency import measure_latency_row

LATENCY_INTERVAL = 5.0  # s between latency probes
PROBE_BYTES = 65536  # ping-pong payload
MEMORY_INTERVAL = 0.5  # s between memory samples


def process_memory_bytes(device: str = "cpu") -> float:
    """Memory in use by this rank: GPU memory on a CUDA device, else the process RSS."""
    if device.startswith("cuda"):
        try:
            import torch

            return float(torch.cuda.memory_allocated(device))
        except Exception:  # noqa: BLE001 - fall back to NVML, then RSS
            pass
        try:
            import pynvml  # nvidia-ml-py; fails soft without an NVIDIA driver

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(device.split(":")[-1] or 0))
            return float(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception:  # noqa: BLE001
            pass
    return float(psutil.Process(os.getpid()).memory_info().rss)


class MetricsMonitor:
    """Samples memory every ``memory_interval`` s and this rank's latency row every
    ``latency_interval`` s on a daemon thread; a :class:`~bno_hvd.Balancer` given it reports both
    (what ``bno``'s formula reads).

    Args:
        comm: a communicator reserved for the monitor (``COMM_WORLD.Dup()``); None: no latency probes.
        device: where memory is counted: ``"cpu"`` (the process's RSS) or ``"cuda:N"``.
        memory_interval: seconds between two memory samples.
        latency_interval: seconds between two latency probes (every rank wakes at the same multiples).
        payload_bytes: the ping-pong message of a probe.
        repeats: round trips per pair in a probe (their median is kept).
        max_rounds: rounds of pairs per probe, rotating from probe to probe (None: every round).
        rank, size: this rank and the job's size where ``comm`` is None (a torchrun job has no MPI
            for the probes): the latency row still holds one entry per rank, unknown but its own.

    Example::

        mon = MetricsMonitor(MPI.COMM_WORLD.Dup(), latency_interval=5.0).start()
        bal = Balancer(MPI.COMM_WORLD.Dup(), make_strategy("bno", hvd.size(), 32), len(data), monitor=mon)
        mon.memory_used, mon.latency_row   # the latest values (bytes; seconds per rank)
        mon.stop()
    """

    def __init__(
        self,
        comm=None,
        *,
        device: str = "cpu",
        memory_interval: float = MEMORY_INTERVAL,
        latency_interval: float = LATENCY_INTERVAL,
        payload_bytes: int = PROBE_BYTES,
        repeats: int = 3,
        max_rounds: int | None = 8,
        rank: int = 0,
        size: int = 1,
    ):
        self.comm = comm
        self.device = device
        self.memory_interval = memory_interval
        self.latency_interval = latency_interval
        self.payload_bytes = payload_bytes
        self.repeats = repeats
        self.max_rounds = max_rounds
        size = comm.Get_size() if comm is not None else size
        rank = comm.Get_rank() if comm is not None else rank
        row = np.full(size, np.nan)
        row[rank] = 0.0
        self.latency_row = row
        self.memory_used = process_memory_bytes(device)
        self.peak_memory = self.memory_used
        self.probe_seconds: list[float] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refresh = 0
        self._lock = threading.Lock()

    def probe_latency_now(self) -> np.ndarray:
        """Measure the latency row once (collective over the monitor's comm)."""
        t0 = time.perf_counter()
        row = measure_latency_row(
            self.comm,
            payload_bytes=self.payload_bytes,
            repeats=self.repeats,
            refresh=self._refresh,
            max_rounds=self.max_rounds,
        )
        self.probe_seconds.append(time.perf_counter() - t0)
        self._refresh += 1
        with self._lock:
            # keep older measurements for pairs this refresh did not sample
            self.latency_row = np.where(np.isnan(row), self.latency_row, row)
        return self.latency_row

    def sample_memory_now(self) -> float:
        used = process_memory_bytes(self.device)
        self.memory_used = used
        self.peak_memory = max(self.peak_memory, used)
        return used

    def _agree_to_stop(self) -> bool:
        """Collective: True when any rank asked its monitor to stop (so all stop together,
        and no prober is left waiting for a partner that has gone)."""
        from mpi4py import MPI

        flag = np.array([1 if self._stop.is_set() else 0], dtype=np.int32)
        out = np.zeros(1, dtype=np.int32)
        req = self.comm.Iallreduce(flag, out, op=MPI.MAX)
        while not req.Test():
            time.sleep(0.001)
        return bool(out[0])

    def _run(self) -> None:
        next_probe = self._next_tick(time.time()) if self._probing else math.inf
        try:
            while True:
                self.sample_memory_now()
                if not self._probing:
                    if self._stop.wait(self.memory_interval):
                        return
                    continue
                if self._stop.is_set() or time.time() >= next_probe:
                    if self._agree_to_stop():
                        return
                    self.probe_latency_now()
                    next_probe = self._next_tick(time.time())
                self._stop.wait(min(self.memory_interval, max(0.0, next_probe - time.time())))
        except Exception as err:  # noqa: BLE001 - report, never kill the training thread
            self.error = f"{type(err).__name__}: {err}"

    def latest_row(self) -> np.ndarray:
        with self._lock:
            return self.latency_row.copy()

    @property
    def _probing(self) -> bool:
        return self.comm is not None and self.comm.Get_size() > 1 and self.latency_interval > 0

    def _next_tick(self, now: float) -> float:
        return (math.floor(now / self.latency_interval) + 1) * self.latency_interval

    def start(self) -> MetricsMonitor:
        self._thread = threading.Thread(target=self._run, name="bno-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop sampling. With probing on, every rank must call it (it is collective);
        it returns within about one ``latency_interval``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else 3 * self.latency_interval + 30)
