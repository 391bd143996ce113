"""Turn real-valued batch shares into integers that sum exactly to the global batch.

:func:`round_to_total` is largest-remainder (Hamilton) rounding with per-rank bounds:

1. scale the values so they sum to ``total`` (they usually already do);
2. clamp each to ``[lower, upper_i]`` and take the floor;
3. hand out the shortfall one sample at a time to the ranks with the largest fractional
   remainder that still have room (ties: lower rank first); an excess (caused by clamping up to
   ``lower``) is taken back from the ranks with the smallest remainder that are above ``lower``.
   If more units remain than ranks with room, every such rank gets the same bulk amount first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bno_hvd.common.errors import UsageError, check_invariant


def round_to_total(
    values: Sequence[float], total: int, lower: int = 1, upper: Sequence[int | None] | None = None
) -> list[int]:
    """Integers ``b_i`` in ``[lower, upper_i]`` with ``sum(b) == total``, close to ``values``.

    ``upper`` is one cap per rank (None = no cap). Raises :class:`UsageError` when no such
    integers exist (``total < N * lower`` or ``total > sum(upper)``).

    Usage::

        round_to_total([2.5, 2.5, 5.0], 10)  # -> [3, 2, 5]
    """
    v = np.asarray(values, dtype=float)
    n = v.size
    if v.ndim != 1 or n == 0:
        raise UsageError("round_to_total needs a non-empty list of values")
    if not np.isfinite(v).all():
        raise UsageError("round_to_total got a non-finite value; check the allocation inputs")
    if isinstance(total, bool) or not isinstance(total, (int, np.integer)):
        raise UsageError(f"the global batch must be an integer, got {total!r}")
    total = int(total)
    lo, hi = _bounds(n, lower, upper)
    if total < n * lower:
        raise UsageError(
            f"global batch {total} is smaller than {n} ranks x {lower} sample(s); "
            f"use a global batch of at least {n * lower}"
        )
    if total > hi.sum():
        raise UsageError(
            f"global batch {total} exceeds the ranks' combined memory caps "
            f"({int(hi.sum())}); lower the global batch or free memory"
        )
    v = np.maximum(v, 0.0)
    s = v.sum()
    target = v * (total / s) if s > 0 else np.full(n, total / n)
    target = np.clip(target, lo, hi)
    out = np.floor(target).astype(np.int64)
    remainder = target - out
    _distribute(out, remainder, total - int(out.sum()), lo, hi)
    ok = int(out.sum()) == total and bool((out >= lo).all() and (out <= hi).all())
    check_invariant(ok, f"rounding to {total} gave {out.tolist()[:8]}")
    return out.tolist()


def _bounds(n: int, lower: int, upper) -> tuple[np.ndarray, np.ndarray]:
    if lower < 0:
        raise UsageError(f"lower bound must be >= 0, got {lower}")
    lo = np.full(n, int(lower), dtype=np.int64)
    big = np.iinfo(np.int64).max // (4 * n)  # "no cap", still safe to sum
    if upper is None:
        return lo, np.full(n, big, dtype=np.int64)
    if len(upper) != n:
        raise UsageError(f"got {len(upper)} batch caps for {n} ranks; give one per rank")
    hi = np.array([big if u is None else int(u) for u in upper], dtype=np.int64)
    if (hi < lo).any():
        i = int(np.flatnonzero(hi < lo)[0])
        raise UsageError(
            f"rank {i} has batch cap {hi[i]} below the minimum {lower}; free memory on that rank or drop it"
        )
    return lo, hi


def _distribute(out: np.ndarray, remainder: np.ndarray, left: int, lo: np.ndarray, hi: np.ndarray) -> None:
    """Add ``left`` (may be negative) to ``out`` in place, one unit per rank per pass."""
    step = 1 if left > 0 else -1
    first_pass = True
    while left != 0:
        room = (hi - out) if step > 0 else (out - lo)
        eligible = np.flatnonzero(room > 0)
        # Feasibility was checked by the caller, so there is always someone with room.
        check_invariant(eligible.size > 0, "a rank with room for the rest of the global batch")
        need = abs(left)
        if need >= eligible.size and not first_pass:
            bulk = min(need // eligible.size, int(room[eligible].min()))
            out[eligible] += step * bulk
            left -= step * bulk * eligible.size
            continue
        key = -remainder[eligible] if step > 0 else remainder[eligible]
        order = eligible[np.argsort(key, kind="stable")][:need]
        out[order] += step
        left -= step * order.size
        first_pass = False
