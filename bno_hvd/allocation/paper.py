"""BalanceNet Orchestrator (BNO, ICOIN 2024), equations (1)-(5), implemented exactly.

    (1) K_i    = OPS_i / sum_k OPS_k                      share of compute throughput
    (2) MW_i   = 1 - MU_i / sum_k MU_k                    memory weight
    (3) NL_ij  = T_response - T_request                   measured elsewhere (control plane)
    (4) NCW_ij = 1 - NL_ij / max_k NL_ik                  network communication weight
    (5) BS_i   = max( floor( (K_i + MW_i + sum_j NCW_ij) / 3 * B ), 1 )

Eq. (5) is the paper's formula, not a normalised split: ``sum_j NCW_ij`` can reach N, so the
global batch ``sum_i BS_i`` drifts away from ``N * B``. We keep it that way on purpose (the
strategy reports ``changes_global_batch = True`` so the trainer can scale the learning rate).

Degenerate cases, chosen so the result is always N ints >= 1:

* Missing OPS (None, NaN, +/-inf) counts as 0. If every OPS is 0, K_i = 1/N (no information,
  so no rank is favoured). Negative OPS is a caller bug and raises :class:`UsageError`.
* All memory zero (sum MU = 0): MW_i = 1 - 1/N for every rank. That is the value eq. (2) gives
  whenever all ranks use *equal* memory, so the weights stay continuous along equal usage and a
  single rank gets MW = 0 whether or not it reports memory.
* One rank: K = 1, MW = 0 (MU_0 / MU_0 = 1, or the all-zero rule above), NCW = [[1]], hence
  BS_0 = max(floor(2B/3), 1); e.g. B = 32 gives 21. That is what eq. (5) says for N = 1.
* A latency row whose maximum is 0 (all zero, including the one-rank case): NCW_ij = 1 for all j,
  i.e. a rank that sees no latency has no communication penalty. NL_ii = 0 gives NCW_ii = 1.
* floor() is taken of ``x + FLOOR_EPS`` (1e-9) so that a value that is an integer in exact
  arithmetic but lands at 33.99999999999999 in floating point still floors to 34. The guard is
  far below one sample, so it never changes a genuinely fractional result.

The functions accept lists or numpy arrays and are vectorised (N = 4096 takes milliseconds).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bno_hvd.common.errors import UsageError, check_invariant

FLOOR_EPS = 1e-9


def compute_k(ops: Sequence[float | None]) -> list[float]:
    """Eq. (1): each rank's share of the total throughput. Missing/non-finite OPS count as 0."""
    return _compute_k(ops).tolist()


def memory_weights(memory_used: Sequence[float]) -> list[float]:
    """Eq. (2): ``1 - MU_i / sum MU``; all-zero memory gives ``1 - 1/N`` for every rank."""
    return _memory_weights(memory_used).tolist()


def network_weights(latency) -> list[list[float]]:
    """Eq. (4): the NCW matrix ``1 - NL_ij / max_k NL_ik`` (a row with max 0 is all ones)."""
    return _network_weights(_latency(latency)).tolist()


def bno_batch_sizes(ops, memory_used, latency, base_batch_size: int) -> list[int]:
    """Eq. (5): per-rank batch sizes (N ints >= 1) from OPS, memory in use and latency.

    Usage::

        bno_batch_sizes([100, 100, 100, 200], [1e9] * 4, latency, 32)  # -> [34, 31, 31, 36]
    """
    if isinstance(base_batch_size, bool) or not isinstance(base_batch_size, (int, np.integer)) or base_batch_size < 1:
        raise UsageError(f"base batch size must be an integer >= 1, got {base_batch_size!r}")
    k = _compute_k(ops)
    mw = _memory_weights(memory_used)
    lat = _latency(latency)
    n = k.size
    if mw.size != n or lat.shape != (n, n):
        raise UsageError(
            f"BNO needs one OPS and one memory value per rank and an NxN latency "
            f"matrix; got {n} OPS, {mw.size} memory values, latency {lat.shape}"
        )
    ncw_sum = _network_weight_sums(lat)
    raw = (k + mw + ncw_sum) / 3.0 * base_batch_size
    sizes = np.maximum(np.floor(raw + FLOOR_EPS), 1).astype(np.int64)
    check_invariant(sizes.shape == (n,) and bool((sizes >= 1).all()), "BNO sizes are N ints >= 1")
    return sizes.tolist()


def _compute_k(ops) -> np.ndarray:
    arr = np.array([np.nan if x is None else float(x) for x in ops], dtype=float)
    if arr.size == 0:
        raise UsageError("BNO needs at least one rank's OPS")
    if (arr < 0).any():
        raise UsageError(f"OPS must be >= 0 samples/s, got {arr[arr < 0][0]}")
    arr = np.where(np.isfinite(arr), arr, 0.0)
    total = arr.sum()
    if total <= 0:
        return np.full(arr.size, 1.0 / arr.size)
    return arr / total


def _memory_weights(memory_used) -> np.ndarray:
    mu = np.asarray(memory_used, dtype=float)
    if mu.ndim != 1 or mu.size == 0:
        raise UsageError("BNO needs one memory_used value per rank")
    if not np.isfinite(mu).all() or (mu < 0).any():
        raise UsageError("memory_used must be finite and >= 0 bytes for every rank")
    total = mu.sum()
    if total <= 0:
        return np.full(mu.size, 1.0 - 1.0 / mu.size)
    return 1.0 - mu / total


def _latency(latency) -> np.ndarray:
    lat = np.asarray(latency, dtype=float)
    if lat.ndim != 2 or lat.shape[0] != lat.shape[1]:
        raise UsageError(f"latency must be an NxN matrix, got shape {lat.shape}")
    if not np.isfinite(lat).all() or (lat < 0).any():
        raise UsageError("latency must be finite and >= 0 seconds everywhere")
    return lat


def _network_weight_sums(lat: np.ndarray) -> np.ndarray:
    # sum_j (1 - NL_ij / m_i) = N - sum_j NL_ij / m_i: same value, no NxN temporary.
    row_max = lat.max(axis=1)
    safe = np.where(row_max > 0, row_max, 1.0)
    return lat.shape[1] - lat.sum(axis=1) / safe


def _network_weights(lat: np.ndarray) -> np.ndarray:
    row_max = lat.max(axis=1, keepdims=True)
    # A zero row max means "no latency seen": divide by 1 instead, which yields 1 - 0 = 1.
    safe = np.where(row_max > 0, row_max, 1.0)
    return 1.0 - lat / safe
