"""The model behind ``balanced``: fit each rank's step time, split a global batch so ranks finish together.

:func:`fit_shape` fits ``t_i = c_i * (k * passes_i(b) + b)`` to every rank's recent (batch,
seconds) pairs, one fixed cost ``k`` (in samples) for all (``passes`` = micro-batches under a
memory cap, 1 without); :func:`solve_equal_finish` finds the real batch sizes whose predicted times (plus per-rank
offsets) are equal. :mod:`bno_hvd.allocation.balanced` decides when to use them.
"""

from __future__ import annotations

import math

import numpy as np

from bno_hvd.common.errors import UsageError


def passes(b, cap):
    """Forward/backward passes a batch of ``b`` samples takes under a memory cap (None: one)."""
    b = np.asarray(b, dtype=float)
    if cap is None:
        return np.ones_like(b)
    cap = np.asarray([np.inf if c is None else float(c) for c in np.atleast_1d(cap)]) if np.ndim(cap) else float(cap)
    return np.where(np.isfinite(cap), np.ceil(b / np.where(np.isfinite(cap), cap, 1.0)), 1.0)


def valid_points(samples, window: int) -> list[tuple[float, float]]:
    """The last ``window`` ``(batch, seconds)`` pairs with a finite, positive batch and time."""
    return [
        (float(b), float(t))
        for b, t in list(samples)[-window:]
        if math.isfinite(b) and math.isfinite(t) and b > 0 and t > 0
    ]


def step_time(a, c, b, caps=None, offsets=None) -> np.ndarray:
    """Predicted time of batches ``b``: ``a_i * passes(b_i) + c_i * b_i + offset_i``."""
    b = np.asarray(b, dtype=float)
    return np.asarray(a) * passes(b, caps) + np.asarray(c) * b + (0.0 if offsets is None else np.asarray(offsets))


def in_set(model, inside) -> tuple:
    """``(a, c, caps, offsets)`` for the ranks ``inside`` (a mask) under ``model = (a, c, caps,
    offsets[, beyond])``: a rank's part of the allreduce can start early only by what waiting buys
    back (``beyond``: :func:`~.offsets.beyond_budget`), so no offset is less than the largest
    ``beyond`` of the ranks inside: that much of the slowest part runs after the last arrival."""
    a, c, caps, offsets, *rest = model
    if not rest or rest[0] is None:
        return a, c, caps, offsets
    floor = float(np.max(np.asarray(rest[0], dtype=float)[np.asarray(inside, dtype=bool)], initial=0.0))
    return a, c, caps, np.maximum(np.asarray(offsets, dtype=float), floor)


def predicted_step(model, sizes) -> float:
    """A split's predicted step: its slowest rank's time under ``model = (a, c, caps, offsets[,
    beyond])`` (a rank with 0 samples sits the update out: it takes no time)."""
    now = in_set(model, np.asarray(sizes) > 0)
    times = step_time(*now[:2], sizes, *now[2:])
    return float(np.max(times[np.asarray(sizes) > 0]))


def split_without(model, out, total: int) -> list[int]:
    """``total`` samples split over every rank not in ``out`` (a rank or a collection of ranks,
    which get 0) so that they finish together under ``model = (a, c, caps, offsets[, beyond])``."""
    keep = np.ones(len(model[0]), dtype=bool)
    keep[[int(out)] if np.isscalar(out) else sorted(out)] = False
    a, c, caps, offsets = in_set(model, keep)
    cap = None if caps is None else [x for x, k in zip(caps, keep) if k]
    kept = (np.asarray(a)[keep], np.asarray(c)[keep], cap, np.asarray(offsets)[keep])
    sizes = np.zeros(len(a), dtype=int)
    sizes[keep] = _round_fastest(kept, solve_equal_finish(*kept[:2], total, *kept[2:]), total)
    return [int(b) for b in sizes]


def _round_fastest(model, part, total: int) -> np.ndarray:
    """Whole samples for the real split ``part``: each rank its floor, then one sample at a time to
    the rank predicted to finish first with it (ties: the largest remainder), which gives the
    integer split of least predicted step. (Largest remainders alone gave speeds 1, 0.6, 0.6,
    0.3075 51,31,30,16, whose slowest rank takes 16 / 0.3075 = 52.0 sample-times; this gives
    51,31,31,15: 51.7.)"""
    part = np.asarray(part, dtype=float)
    b = np.maximum(np.floor(part + 1e-9), 1.0)
    for _ in range(int(b.sum()) - total):  # (past the solver's float tolerance: the slowest gives one back)
        b[int(np.argmax(np.where(b > 1, step_time(*model[:2], b, *model[2:]), -np.inf)))] -= 1
    for _ in range(total - int(b.sum())):
        t = step_time(*model[:2], b + 1, *model[2:])
        first = np.flatnonzero(t <= t.min() * (1 + 1e-9))
        b[first[int(np.argmax((part - b)[first]))]] += 1
    return b.astype(int)


def solve_equal_finish(a, c, total: float, caps=None, offsets=None) -> list[float]:
    """Real batch sizes ``b_i >= 1`` summing to ``total`` whose ranks finish together.

    Rank i's time is ``a_i * ceil(b_i / cap_i) + c_i * b_i + offset_i`` (``caps``: memory caps in
    samples per forward/backward pass, None = no cap: then ``a_i + c_i * b_i``; ``offsets``: seconds
    per update that do not depend on the batch, such as a slower link). A share above the
    cap is processed in micro-batches, each paying ``a_i`` again, so the equal-finish split accounts
    for it instead of holding the rank at its cap. Every rank not held at 1 sample finishes at the
    same ``T*`` (up to the jumps of the step function, where a rank stays at a multiple of its cap).

    Usage::

        solve_equal_finish([0.1, 0.2, 0.0, 0.05], [0.01, 0.02, 0.005, 0.01], 100)
        # -> [17.78, 3.89, 55.56, 22.78]: every rank takes T* = 0.278 s
        solve_equal_finish([0.01] * 4, [0.001, 0.001, 0.001, 0.003], 128, caps=[16] * 4)
        # -> [37.33, 37.33, 37.33, 16.0]: 3 micro-batches on the fast ranks; one more pass on
        #    the slow rank would cost more than it saves
    """
    a = np.asarray(a, dtype=float)
    c = np.asarray(c, dtype=float)
    n = a.size
    if c.shape != (n,) or n == 0 or not (np.isfinite(a).all() and np.isfinite(c).all()) or (c <= 0).any():
        raise UsageError("solve_equal_finish needs N finite a_i and N finite c_i > 0")
    cap = np.full(n, np.inf) if caps is None else np.array([np.inf if m is None else float(m) for m in caps])
    if cap.shape != (n,) or (cap < 1).any():
        raise UsageError("caps needs one cap >= 1 (or None) per rank")
    o = np.zeros(n) if offsets is None else np.asarray(offsets, dtype=float)
    if o.shape != (n,) or not np.isfinite(o).all():
        raise UsageError("offsets needs one finite number of seconds per rank")
    if not n <= total:
        raise UsageError(f"global batch {total} is smaller than {n} ranks x 1 sample; change the global batch")

    def sizes(t: float) -> np.ndarray:
        return np.maximum(_largest_batch(a, c, cap, t - o), 1.0)

    if caps is None or np.isinf(cap).all():  # the closed form: ranks below 1 sample held at 1, in turn
        free = np.ones(n, dtype=bool)
        while free.any():
            t_lo = t_hi = (total - (~free).sum() + ((a + o) / c)[free].sum()) / (1.0 / c)[free].sum()
            low = free & (sizes(t_lo) <= 1.0)
            if not low.any():
                break
            free &= ~low  # (each one held at 1 leaves the others less: T* only falls, none comes back)
        if free.any():
            b = sizes(t_lo)
        else:  # every rank held at 1 (a global batch of one sample per rank): 0 / 0 above
            b = np.ones(n)
            t_lo = t_hi = float(step_time(a, c, b, None, o).max())
    else:  # sum(sizes(T)) is continuous and non-decreasing in T: bracket the root, then bisect
        t_lo = float(step_time(a, c, np.ones(n), caps, o).min())
        t_hi = float(step_time(a, c, np.full(n, float(total)), caps, o).max())
        for _ in range(200):
            mid = 0.5 * (t_lo + t_hi)
            if mid <= t_lo or mid >= t_hi:
                break
            if sizes(mid).sum() < total:
                t_lo = mid
            else:
                t_hi = mid
        b = sizes(t_hi)
    # With caps, several ranks can sit on a jump (at k * cap) at T*: share out what is left.
    if abs(b.sum() - total) > 1e-9 * max(total, 1.0):
        low = sizes(t_lo)
        gap = b - low
        missing = total - low.sum()
        b = low + gap * (missing / gap.sum()) if gap.sum() > 0 else low
    # Exact up to float64: one step of T moves rank i by spacing(T) / c_i samples, which is more
    # than 1e-6 of the total when a large fixed cost (a slow link) meets a tiny c.
    resolution = len(b) * np.spacing(max(abs(t_lo), abs(t_hi))) / c.min()
    if not abs(b.sum() - total) <= 1e-6 * max(total, 1.0) + 4 * resolution:
        raise UsageError(
            f"solve_equal_finish: the sizes sum to {b.sum():.6g}, not the global batch {total}: the fixed costs "
            "are too large against the per-sample costs for float64; check the step times (seconds) it was given"
        )
    return b.tolist()


def _largest_batch(a: np.ndarray, c: np.ndarray, cap: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per rank, the largest real ``b`` with ``a * ceil(b / cap) + c * b <= t`` (0 if none)."""
    t = np.broadcast_to(np.asarray(t, dtype=float), a.shape)
    out = np.zeros_like(a)
    plain = np.isinf(cap)
    out[plain] = (t[plain] - a[plain]) / c[plain]
    for i in np.flatnonzero(~plain):
        # With k passes the batch is at most min(k * cap, (t - k a) / c), and needs more than
        # (k - 1) * cap samples; the best k is near where k * cap = (t - k a) / c.
        k_star = t[i] / (c[i] * cap[i] + a[i]) if c[i] * cap[i] + a[i] > 0 else 1.0
        best = 0.0
        for k in {max(1, int(math.floor(k_star)) + d) for d in (-1, 0, 1, 2)}:
            candidate = min(k * cap[i], (t[i] - k * a[i]) / c[i])
            if candidate > (k - 1) * cap[i]:
                best = max(best, candidate)
        out[i] = best
    return np.maximum(out, 0.0)


def fit_shape(windows, caps, window: int, most: float, shape: float = 0.0, groups=None):
    """One model for every rank: a step of ``b`` samples takes ``c_i * (k * passes_i(b) + b)`` s.

    ``k`` (the fixed cost of a pass, in samples) is one number for the cluster: every rank runs the
    same code, and a CPU limit or a slower device scales fixed and per-sample costs together.
    ``groups``: lists of ranks known to run at one speed (one CPU limit), which share one ``c``
    fitted to their steps together (each step with its own rank's passes); alone, a rank is its
    own group. ``k`` is the one in ``[0, most]`` that fits, with the same groups, the steps of
    every group whose sizes differ by 25% or more or whose ranks take different numbers of passes
    (least squares of each group's times over their mean): ranks at one speed under different
    memory caps price a pass even at one size. Where no group did, ``shape`` (the last one) stands:
    one size cannot tell a fixed cost from a per-sample one, and two close sizes under jittery
    steps (10 and 11 samples) gave any ``k`` from 0 to the limit. Every step counts: under a long
    CFS period a rank's steps are bimodal (within its budget, or a whole period later), and
    dropping either mode as outliers misjudged its mean by 20x.
    Returns ``(k, c)``: ``c`` per rank (NaN: no usable step).
    """
    steps = [np.array(valid_points(samples, window)).reshape(-1, 2) for samples in windows]
    groups = [list(g) for g in groups] if groups else [[i] for i in range(len(steps))]
    data = []  # per group: its steps' sizes, passes and times
    for g in groups:
        b, t = (np.concatenate([steps[i][:, j] for i in g]) for j in (0, 1))
        data.append((b, np.concatenate([passes(steps[i][:, 0], caps[i]) for i in g]), t))
    spanning = [(b, m, t) for b, m, t in data if len(b) and (b.max() >= 1.25 * b.min() or m.max() > m.min())]
    k = float(shape)
    if spanning and most > 0:
        grid = np.concatenate([[0.0], np.geomspace(most / 1000, most, 61)])
        for _ in range(2):  # a coarse grid, then a fine one around its best
            k = float(grid[np.argmin(_misfit(spanning, grid))])
            grid = np.linspace(k / 1.13, min(k * 1.13, most), 41)
    c = np.full(len(steps), np.nan)
    for g, (b, m, t) in zip(groups, data):
        x = k * m + b
        if len(x):
            c[g] = float(t @ x / (x @ x))
    return k, c


def _misfit(spanning, grid: np.ndarray) -> np.ndarray:
    """For each ``k`` of ``grid``: the squared error of the best ``c * (k * passes + b)`` fit to
    each group's steps (times over their mean), summed over the groups."""
    total = np.zeros(grid.size)
    for b, m, t in spanning:
        t, x = t / t.mean(), grid[:, None] * m[None, :] + b
        c = (x @ t) / (x * x).sum(axis=1)
        total += ((t - c[:, None] * x) ** 2).sum(axis=1)
    return total
