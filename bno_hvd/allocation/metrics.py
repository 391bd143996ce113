"""What rank 0 knows about the cluster at a rebalance: :class:`ClusterMetrics`.

Units: ``ops`` in samples/s, ``memory_used`` in bytes, ``latency`` in seconds (measured round
trips), ``compute_samples`` as ``(batch_size, compute_seconds)`` pairs, ``max_batch`` in samples,
``sync_cpu`` in CPU seconds per update (a rank's sync phase), ``cpu_limit`` in cores,
``cycle_samples`` as ``(update, seconds)`` of whole updates, ``cpu_share`` as run time / runnable time.

Physical ranges (``validate()``; the constants live in :mod:`bno_hvd.common.parsing`): ops 0, or 1e-3
to 1e9 samples/s (a non-zero rate below that is noise, and its reciprocal overflows); memory 0 to
1e18 bytes; latency 0 to 60 s per round trip; compute samples of 1 to 1e6 samples in 1e-6 to
86400 s, at no more than 1e9 samples/s; caps 1 to 1e6 samples. A number outside them is not a
measurement (a file of 1e308 once passed, and every strategy computed an allocation from
infinities while numpy printed overflow warnings).

``validate()`` is the strict boundary check (used for metrics files and by the CLI). Strategies
never call it at run time: they must survive a rank with missing numbers, see :func:`usable_ranks`.

Latency symmetry: ``NL[i][j]`` and ``NL[j][i]`` are both round trips over the same pair, so they
agree in expectation but not sample by sample. ``validate()`` rejects a pair only when
``|NL_ij - NL_ji| > SYMMETRY_RTOL * max(NL_ij, NL_ji) + SYMMETRY_ATOL``: a factor of two plus 1 ms
is far beyond jitter on a real link, and typically means a transposed or garbled matrix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import (
    BATCH,
    CAP,
    CPU_LIMIT,
    CPU_PERIOD,
    CPU_SECONDS,
    LATENCY,
    MEMORY,
    OPS,
    STEP_SECONDS,
    Range,
    as_float,
    show_value,
)

SYMMETRY_RTOL = 0.5
SYMMETRY_ATOL = 1e-3  # seconds


@dataclass
class ClusterMetrics:
    """Per-rank measurements gathered on rank 0: what :meth:`~bno_hvd.Strategy.rebalance` reads.
    Lists have length N (index = rank); a missing number is None (or NaN).

    Args:
        ops: samples/s per rank.
        memory_used: bytes in use per rank.
        latency: NxN seconds, ``latency[i][j]`` the measured round trip i -> j, diagonal 0 (a list
            of lists or a numpy array).
        compute_samples: per rank, recent ``(batch_size, compute_seconds)`` pairs.
        max_batch: per rank, its memory cap in samples (None: no cap).
        sync_samples: per rank, recent ``(update, sync_seconds)`` pairs.
        sync_cpu: per rank, CPU seconds of one sync phase.
        cpu_limit: per rank, its CPU limit in cores (None: none).
        cpu_period: per rank, the CFS period of that limit in seconds.
        cycle_samples: per rank, recent ``(update, seconds)`` of whole updates.
        cpu_share: per rank, time on a CPU over runnable time.
        cpu_per_wall: per rank, CPU seconds per wall second.

    Example::

        m = ClusterMetrics(ops=[100.0, 50.0], memory_used=[1e9, 2e9], latency=[[0, 1e-4], [1e-4, 0]])
        m.validate()                                     # a UsageError outside the physical ranges
        make_strategy("proportional", 2, 32).rebalance(m, [32, 32], update=10)   # [43, 21]
    """

    ops: list  # list[float | None]: samples/s; None or NaN = not measured
    memory_used: list  # list[float]: bytes in use per rank
    latency: list  # NxN seconds, NL[i][j] measured round trip i->j, diagonal 0
    compute_samples: list = field(default_factory=list)  # per rank [(batch_size, seconds), ...]
    max_batch: list = field(default_factory=list)  # per rank batch cap, None = no cap
    sync_samples: list = field(default_factory=list)  # per rank [(update, sync seconds), ...]
    sync_cpu: list = field(default_factory=list)  # per rank CPU seconds of one sync phase, None = unknown
    cpu_limit: list = field(default_factory=list)  # per rank CPU limit in cores (cgroup quota), None = none
    cpu_period: list = field(default_factory=list)  # per rank CFS period of that limit in seconds, None = unknown
    cycle_samples: list = field(default_factory=list)  # per rank [(update, seconds of the whole update), ...]
    cpu_share: list = field(default_factory=list)  # per rank time on a CPU / runnable time, None = unknown
    cpu_per_wall: list = field(default_factory=list)  # per rank CPU seconds per wall second, None = unknown

    def __post_init__(self):
        # Empty defaults mean "nothing measured": expand them to one entry per rank.
        if len(self.compute_samples) == 0:
            self.compute_samples = [[] for _ in range(self.n)]
        if len(self.max_batch) == 0:
            self.max_batch = [None] * self.n
        if len(self.sync_samples) == 0:
            self.sync_samples = [[] for _ in range(self.n)]
        if len(self.sync_cpu) == 0:
            self.sync_cpu = [None] * self.n
        if len(self.cpu_limit) == 0:
            self.cpu_limit = [None] * self.n
        if len(self.cpu_period) == 0:
            self.cpu_period = [None] * self.n
        if len(self.cycle_samples) == 0:
            self.cycle_samples = [[] for _ in range(self.n)]
        if len(self.cpu_share) == 0:
            self.cpu_share = [None] * self.n
        if len(self.cpu_per_wall) == 0:
            self.cpu_per_wall = [None] * self.n

    @property
    def n(self) -> int:
        """Number of ranks (the length of ``ops``)."""
        return len(self.ops)

    def ops_array(self) -> np.ndarray:
        """``ops`` as float64 with NaN where a rank has no measurement."""
        return np.array([np.nan if x is None else as_float(x) for x in self.ops], dtype=float)

    def latency_array(self) -> np.ndarray:
        """``latency`` as an NxN float64 array (no copy when it already is one)."""
        return np.asarray(self.latency, dtype=float)

    def validate(self) -> None:
        """Raise :class:`UsageError` (one line naming the field) unless every number is usable.

        Checks: all per-rank lists have length N >= 1; ``ops`` entries are None or finite >= 0;
        ``memory_used`` finite >= 0; ``latency`` NxN, finite, >= 0, zero diagonal, symmetric within
        the tolerance in the module docstring; ``max_batch`` None or int >= 1; compute samples
        are (int >= 1, finite seconds >= 0) pairs.
        """
        n = self.n
        if n < 1:
            raise UsageError("metrics: 'ops' is empty; give one value per rank")
        for name in ("memory_used", "compute_samples", "max_batch", "sync_cpu", "cpu_limit", "cpu_period"):
            got = len(getattr(self, name))
            if got != n:
                raise UsageError(f"metrics: '{name}' has {got} entries but 'ops' has {n}; give one per rank")
        ops = self.ops_array()
        for i, x in enumerate(self.ops):
            if x is not None and not math.isfinite(as_float(x)):
                raise UsageError(f"metrics: ops[{i}] is {x}; use a finite number or null (not measured)")
        _check_non_negative("ops", np.nan_to_num(ops, nan=0.0))
        _check_range("ops", np.nan_to_num(ops, nan=OPS.low), OPS, zero_ok=True)
        memory = np.array([as_float(x) for x in self.memory_used], dtype=float)
        _check_finite("memory_used", memory)
        _check_non_negative("memory_used", memory)
        _check_range("memory_used", memory, MEMORY)
        _validate_latency(self.latency_array(), n)
        for i, cap in enumerate(self.max_batch):
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or not CAP.contains(cap)):
                raise UsageError(
                    f"metrics: max_batch[{i}] is {show_value(cap)}; use an integer {CAP.describe()} or null (no cap)"
                )
        for name, bounds in (("sync_cpu", CPU_SECONDS), ("cpu_limit", CPU_LIMIT), ("cpu_period", CPU_PERIOD)):
            for i, x in enumerate(getattr(self, name)):
                if x is not None and (isinstance(x, bool) or not bounds.contains(as_float(x))):
                    raise UsageError(f"metrics: {name}[{i}] is {show_value(x)}; use {bounds.describe()} or null")
        for i, pairs in enumerate(self.compute_samples):
            for k, (b, t) in enumerate(pairs):
                b, t = as_float(b), as_float(t)
                if not (BATCH.contains(b) and b == int(b) and STEP_SECONDS.contains(t)):
                    raise UsageError(
                        f"metrics: compute_samples[{i}][{k}] is ({show_value(b)}, {show_value(t)}); use "
                        f"(batch_size {BATCH.describe()}, seconds {STEP_SECONDS.describe()})"
                    )
                if b / t > OPS.high:
                    raise UsageError(
                        f"metrics: compute_samples[{i}][{k}] is ({b:g}, {t:g}): {b / t:g} samples/s; "
                        f"a rank computes at most {OPS.high:g} samples/s"
                    )


def usable_ranks(metrics: ClusterMetrics) -> np.ndarray:
    """Boolean mask: True where a rank's ops, memory and latency row are all present and finite."""
    ops = metrics.ops_array()
    memory = np.asarray(metrics.memory_used, dtype=float)
    latency = metrics.latency_array()
    ok = np.isfinite(ops) & (ops >= 0) & np.isfinite(memory) & (memory >= 0)
    if latency.shape == (metrics.n, metrics.n):
        ok &= np.isfinite(latency).all(axis=1) & np.isfinite(latency).all(axis=0)
    else:
        ok[:] = False
    return ok


def _validate_latency(lat: np.ndarray, n: int) -> None:
    if lat.shape != (n, n):
        raise UsageError(f"metrics: 'latency' has shape {lat.shape} but there are {n} ranks; give a {n}x{n} matrix")
    _check_finite("latency", lat)
    _check_non_negative("latency", lat)
    _check_range("latency", lat, LATENCY)
    diag = np.flatnonzero(np.diagonal(lat) != 0)
    if diag.size:
        i = int(diag[0])
        raise UsageError(
            f"metrics: latency[{i}][{i}] is {lat[i, i]}; the diagonal must be 0 (a rank has no latency to itself)"
        )
    bad = _first_asymmetric(lat)
    if bad is not None:
        i, j = bad
        raise UsageError(
            f"metrics: latency is asymmetric at [{i}][{j}]={lat[i, j]} vs [{j}][{i}]="
            f"{lat[j, i]}; round trips must agree within {SYMMETRY_RTOL:.0%} + "
            f"{SYMMETRY_ATOL * 1e3:g} ms (is the matrix transposed or garbled?)"
        )


def _first_asymmetric(lat: np.ndarray, block: int = 512):
    """First (i, j), i < j in row-major order, whose round trips disagree beyond the tolerance."""
    n = lat.shape[0]
    # Compare tile (I, J) with tile (J, I) transposed: small tiles keep the transpose in cache
    # (a whole-matrix lat.T at N = 4096 is several times slower).
    for r0 in range(0, n, block):
        hits = []
        for c0 in range(r0, n, block):
            upper = lat[r0 : r0 + block, c0 : c0 + block]
            lower = lat[c0 : c0 + block, r0 : r0 + block].T
            bad = np.abs(upper - lower) > SYMMETRY_RTOL * np.maximum(upper, lower) + SYMMETRY_ATOL
            if bad.any():
                i, j = np.argwhere(bad)[0]
                hits.append((r0 + int(i), c0 + int(j)))
        if hits:
            return min(hits)
    return None


def _index(flat: int, shape: tuple) -> str:
    return "".join(f"[{int(k)}]" for k in np.unravel_index(flat, shape))


def _check_finite(name: str, arr: np.ndarray) -> None:
    if np.isfinite(arr).all():
        return
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        k = int(bad[0])
        raise UsageError(
            f"metrics: {name}{_index(k, arr.shape)} is {arr.flat[k]}; "
            "use a finite number (NaN/Infinity are not measurements)"
        )


def _check_non_negative(name: str, arr: np.ndarray) -> None:
    if not (arr < 0).any():
        return
    bad = np.flatnonzero(arr < 0)
    if bad.size:
        k = int(bad[0])
        raise UsageError(f"metrics: {name}{_index(k, arr.shape)} is {arr.flat[k]}; values must be >= 0")


def _check_range(name: str, arr: np.ndarray, bounds: Range, zero_ok: bool = False) -> None:
    bad = np.flatnonzero(((arr < bounds.low) & ~((arr == 0) & zero_ok)) | (arr > bounds.high))
    if bad.size:
        k = int(bad[0])
        raise UsageError(
            f"metrics: {name}{_index(k, arr.shape)} is {arr.flat[k]:g}; use {bounds.what} {bounds.describe()}"
            + (" (or 0)" if zero_ok else "")
        )
