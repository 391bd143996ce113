"""Read and write the JSON metrics file behind ``bno-hvd allocate --metrics FILE``.

Format (one entry per rank, index = rank)::

    {"ops": [120.5, 98.0, null],            # samples/s; null = not measured
     "memory_used": [2.1e9, 3.0e9, 1.2e9],  # bytes
     "latency": [[0, 1e-4, 2e-4], ...],     # NxN round trips in seconds, zero diagonal, symmetric
                                            # or, sampled (large N): {"pairs": [[i, j, seconds], ...]}
     "max_batch": [null, 64, null],         # optional: per-rank batch cap
     "compute_samples": [[[32, 0.21]], ...], # optional: per-rank (batch, seconds) pairs
     "sync_cpu": [0.004, 0.004, 0.005],     # optional: CPU seconds of one sync phase; null = unknown
     "cpu_limit": [null, 0.5, 0.17],        # optional: the rank's cgroup CPU limit in cores; null = none
     "cpu_period": [null, 0.1, 0.1]}        # optional: that limit's CFS period in seconds; null = unknown

Every problem becomes one :class:`UsageError` line that names the file and the field. The file
is read by :func:`bno_hvd.common.parsing.read_json` (binary, deeply nested or huge files are refused
there); numbers are checked against the physical ranges of :mod:`bno_hvd.common.parsing` (``OPS``,
``MEMORY``, ``LATENCY``, ``CAP``, ``BATCH``, ``STEP_SECONDS``) by :meth:`ClusterMetrics.validate`,
so no strategy ever computes with infinities. NaN and Infinity (which Python's json accepts) are
refused there too. The latency matrix is returned as an NxN float64 numpy array so a 4096-rank
file stays cheap.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from bno_hvd.allocation.metrics import ClusterMetrics
from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import as_float, read_json, show_path, show_value

REQUIRED = ("ops", "memory_used", "latency")
OPTIONAL = ("max_batch", "compute_samples", "sync_cpu", "cpu_limit", "cpu_period")


def load_metrics_file(path) -> ClusterMetrics:
    """Parse and validate a metrics file. Raises :class:`UsageError` naming the bad field.

    Usage::

        metrics = load_metrics_file("metrics.json")
        sizes = bno_batch_sizes(metrics.ops, metrics.memory_used, metrics.latency, 32)
    """
    data = read_json(path, "metrics file")
    try:
        return _parse(data)
    except UsageError as err:
        raise UsageError(f"{show_path(path)}: {err}") from None


def metrics_to_json(metrics: ClusterMetrics) -> dict:
    """The JSON-serialisable dict :func:`load_metrics_file` reads back (NaN ops become null)."""
    out = {
        "ops": [None if x is None or not math.isfinite(float(x)) else float(x) for x in metrics.ops],
        "memory_used": [float(x) for x in metrics.memory_used],
        "latency": np.asarray(metrics.latency, dtype=float).tolist(),
    }
    if any(cap is not None for cap in metrics.max_batch):
        out["max_batch"] = [None if cap is None else int(cap) for cap in metrics.max_batch]
    if any(len(s) for s in metrics.compute_samples):
        out["compute_samples"] = [[[int(b), float(t)] for b, t in s] for s in metrics.compute_samples]
    for key in ("sync_cpu", "cpu_limit", "cpu_period"):
        values = getattr(metrics, key)
        if any(x is not None for x in values):
            out[key] = [None if x is None else float(x) for x in values]
    return out


def _parse(data) -> ClusterMetrics:
    if not isinstance(data, dict):
        raise UsageError("metrics file must hold a JSON object with keys " + ", ".join(REQUIRED))
    for key in REQUIRED:
        if key not in data:
            raise UsageError(f"metrics file lacks '{key}'; required keys: {', '.join(REQUIRED)}")
    unknown = sorted(set(data) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise UsageError(f"unknown key {unknown[0][:40]!r} in metrics file; allowed: {', '.join(REQUIRED + OPTIONAL)}")
    ops = _numbers("ops", data["ops"], allow_null=True)
    n = len(ops)
    if n == 0:
        raise UsageError("'ops' is empty; give one value per rank")
    memory = _numbers("memory_used", data["memory_used"], allow_null=False)
    _expect_len("memory_used", memory, n)
    latency = _matrix(data["latency"], n)
    kwargs = {}
    if data.get("max_batch") is not None:
        caps = _numbers("max_batch", data["max_batch"], allow_null=True)
        _expect_len("max_batch", caps, n)
        kwargs["max_batch"] = [None if c is None else _int(f"max_batch[{i}]", c) for i, c in enumerate(caps)]
    if data.get("compute_samples") is not None:
        kwargs["compute_samples"] = _samples(data["compute_samples"], n)
    for key in ("sync_cpu", "cpu_limit", "cpu_period"):  # ranges: ClusterMetrics.validate()
        if data.get(key) is not None:
            kwargs[key] = _numbers(key, data[key], allow_null=True)
            _expect_len(key, kwargs[key], n)
    metrics = ClusterMetrics(ops=ops, memory_used=memory, latency=latency, **kwargs)
    metrics.validate()
    return metrics


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _numbers(name: str, value, allow_null: bool) -> list:
    """The list ``value`` as floats (None kept where ``allow_null``); integers too large for a
    float become inf, which validate() then refuses by name."""
    if not isinstance(value, list):
        raise UsageError(f"'{name}' must be a JSON list with one number per rank")
    for i, x in enumerate(value):
        if not (_is_number(x) or (allow_null and x is None)):
            what = "a number or null" if allow_null else "a number"
            raise UsageError(f"{name}[{i}] is {show_value(x)}; use {what}")
    return [None if x is None else as_float(x) for x in value]


def _expect_len(name: str, value: list, n: int) -> None:
    if len(value) != n:
        raise UsageError(f"'{name}' has {len(value)} entries but 'ops' has {n}; give one per rank")


def _int(name: str, x: float) -> int:
    if not math.isfinite(x) or int(x) != x:
        raise UsageError(f"{name} is {show_value(x)}; use an integer")
    return int(x)


def _sparse_matrix(value: dict, n: int) -> np.ndarray:
    """``{"pairs": [[i, j, s], ...]}``: a sampled probe (see control/schedule.py). Pairs not
    measured get the median of those measured; i->j and j->i are averaged."""
    if set(value) != {"pairs"} or not isinstance(value["pairs"], list) or not value["pairs"]:
        raise UsageError("sparse 'latency' must be {\"pairs\": [[i, j, seconds], ...]} with at least one pair")
    pairs = value["pairs"]
    for k, p in enumerate(pairs):
        if not (isinstance(p, list) and len(p) == 3 and all(_is_number(x) for x in p)):
            raise UsageError(f"latency pairs[{k}] is {show_value(p)}; each pair must be [i, j, seconds]")
        if not all(isinstance(r, int) for r in p[:2]):
            raise UsageError(
                f"latency pairs[{k}] names rank {show_value(p[0])} or {show_value(p[1])}; ranks are integers"
            )
        if not all(0 <= r < n for r in p[:2]):
            raise UsageError(f"latency pairs name a rank outside 0..{n - 1}")
    idx = np.array([p[:2] for p in pairs], dtype=np.int64)
    sec = np.array([as_float(p[2]) for p in pairs], dtype=float)
    if (idx < 0).any() or (idx >= n).any():
        raise UsageError(f"latency pairs name a rank outside 0..{n - 1}")
    if (idx[:, 0] == idx[:, 1]).any():
        raise UsageError("latency pairs must not pair a rank with itself (NL_ii is 0)")
    if not np.isfinite(sec).all() or (sec < 0).any():
        raise UsageError("latency pairs must have finite, non-negative seconds")
    # (their upper bound, LATENCY, is checked on the completed matrix by validate())
    # Symmetric completion on the pairs alone (the dense NxN matrix is written only once):
    # both directions measured -> their mean; one -> that value; none -> the median pair.
    lo, hi = idx.min(axis=1), idx.max(axis=1)
    keys, inverse = np.unique(lo * n + hi, return_inverse=True)
    value = np.bincount(inverse, weights=sec) / np.bincount(inverse)
    out = np.full((n, n), float(np.median(value)))
    i, j = keys // n, keys % n
    out[i, j] = value
    out[j, i] = value
    np.fill_diagonal(out, 0.0)
    return out


def _matrix(value, n: int) -> np.ndarray:
    if isinstance(value, dict):
        return _sparse_matrix(value, n)
    if not isinstance(value, list) or len(value) != n:
        got = len(value) if isinstance(value, list) else type(value).__name__
        raise UsageError(f"'latency' must be a list of {n} rows (one per rank), got {got}; give a {n}x{n} matrix")
    for i, row in enumerate(value):
        if not isinstance(row, list) or len(row) != n:
            got = len(row) if isinstance(row, list) else type(row).__name__
            raise UsageError(f"latency row {i} has {got} entries; latency must be square ({n}x{n})")
    # Fast path (a 4096-rank matrix is 16.8M numbers): numpy converts when every entry is a
    # number; anything else (text, null, a list, an integer too large for int64) gives an object
    # array or an error, and a Python scan then names the entry.
    try:
        arr = np.array(value)
    except (ValueError, OverflowError):
        arr = np.array([], dtype=object)
    if arr.dtype.kind not in "iuf" or arr.shape != (n, n):
        for i, row in enumerate(value):
            for j, x in enumerate(row):
                if not _is_number(x):
                    raise UsageError(f"latency[{i}][{j}] is {show_value(x)}; use a number of seconds")
        arr = np.array([[as_float(x) for x in row] for row in value], dtype=float)
    else:  # numpy reads true/false as 1/0 next to numbers: refuse them as the slow path would
        for i, row in enumerate(value):
            j = next((j for j, x in enumerate(row) if x.__class__ is bool), None)
            if j is not None:
                raise UsageError(f"latency[{i}][{j}] is {show_value(row[j])}; use a number of seconds")
    return arr.astype(float, copy=False)


def _samples(value, n: int) -> list:
    if not isinstance(value, list) or len(value) != n:
        raise UsageError(f"'compute_samples' must be a list of {n} lists of [batch, seconds] pairs")
    out = []
    for i, pairs in enumerate(value):
        if not isinstance(pairs, list):
            raise UsageError(f"compute_samples[{i}] must be a list of [batch, seconds] pairs")
        for k, p in enumerate(pairs):
            if not (isinstance(p, list) and len(p) == 2 and _is_number(p[0]) and _is_number(p[1])):
                raise UsageError(f"compute_samples[{i}][{k}] is {show_value(p)}; use [batch, seconds]")
        out.append([(as_float(p[0]), as_float(p[1])) for p in pairs])
    return out
