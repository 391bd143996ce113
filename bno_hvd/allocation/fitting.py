"""The model behind ``balanced``: fit each rank's step time, split a global batch so ranks finish together.

:func:`fit_affine` fits ``t = a * passes(b) + c * b`` to a rank's recent (batch, seconds) pairs
(``passes`` = micro-batches under a memory cap, 1 without), :func:`fit_joint` fits ranks with
the same limit together, :func:`fit_noise` says how far that fit can be trusted,
:func:`solve_equal_finish` finds the real batch sizes whose predicted times
(plus per-rank offsets) are equal. :mod:`bno_hvd.allocation.balanced` decides when to use them.
"""

from __future__ import annotations

import math

import numpy as np

from bno_hvd.allocation.rounding import round_to_total
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


def fit_affine(samples, window: int = 8, cap: int | None = None) -> tuple[float, float] | None:
    """Least-squares ``(a, c)`` for ``t = a * passes(b) + c * b`` over the last ``window`` (b, t) pairs.

    ``passes(b) = ceil(b / cap)`` is the number of micro-batches a step of ``b`` samples takes
    under the rank's memory cap (1 without a cap, where this is the affine fit ``t = a + c * b``):
    ``a`` is the fixed cost of one forward/backward pass, ``c`` the cost of one sample. Pairs with
    a non-finite or non-positive value, and outliers (time per sample more than 2x from the
    window's median), are ignored; returns None if none remain.
    """
    pts = valid_points(samples, window)
    if not pts:
        return None
    # A machine-wide hiccup (page faults, a noisy neighbour) can make one step several times
    # slower on every rank; it says nothing about a rank's speed. Drop steps whose time per
    # sample is more than 2x away from the window's median. A real slowdown becomes the median
    # once it fills half the window, and then the old steps are the ones dropped.
    med = float(np.median([t / b for b, t in pts]))
    pts = [(b, t) for b, t in pts if med / 2 <= t / b <= 2 * med]
    b = np.array([p[0] for p in pts])
    t = np.array([p[1] for p in pts])
    m = passes(b, cap)
    x = np.column_stack([m, b])
    if np.linalg.matrix_rank(x) == 2:
        (a, c), *_ = np.linalg.lstsq(x, t, rcond=None)
        if c > 0 and a >= 0 and c * b.mean() >= 1e-3 * a and _slope_resolved(x, t, a, c):
            return float(a), float(c)
    return 0.0, float((b * t).sum() / (b * b).sum())


def _slope_resolved(x: np.ndarray, t: np.ndarray, a: float, c: float, max_rel_error: float = 0.5) -> bool:
    """Whether the window pins the per-sample cost down: its standard error below half of ``c``.

    Batch sizes close together (32 and 28 after a small move) under steps that jitter by a quota
    period give a slope of any value - 9 ms fixed cost and 0.08 ms per sample was seen on equal
    ranks - and extrapolating that to another size invents a gain. Then the origin fit is used.
    With two points (or exact times) there is no spread to judge, and the fit stands."""
    n = len(t)
    if n <= 2:
        return True
    resid = t - x @ np.array([a, c])
    sigma2 = float(resid @ resid) / (n - 2)
    try:
        var_c = sigma2 * float(np.linalg.inv(x.T @ x)[1, 1])
    except np.linalg.LinAlgError:
        return False
    return math.sqrt(max(var_c, 0.0)) <= max_rel_error * c


def fit_joint(windows, window: int, cap, sigmas: float) -> tuple[tuple[float, float] | None, list[int]]:
    """One affine fit over the steps of several ranks known to run at one speed (the same CPU
    limit and memory cap), and the ranks it holds for.

    A rank held at one batch size cannot resolve its fixed cost alone: its fit through the origin
    charges the fixed cost per sample, so of two equal ranks the one with fewer samples looks
    slower per sample and is given fewer again (seen: 47,32,47 on three equal limits at a 100 ms
    CFS period, each fit 15-20% apart). Their steps together span several sizes, which resolves
    it. A rank whose mean residual from the joint fit is beyond ``sigmas`` standard errors of its
    own steps is really different (another process on its core): it is left out, the worst
    first, and the rest refitted. Returns ``(None, [])`` when the steps span one size, or the fit
    does not resolve a fixed cost, or fewer than two ranks agree: their own fits stand then.
    (``windows``: each rank's recent ``(batch, seconds)``; ``window``: how many of each count.)"""
    own = {}
    for i, samples in enumerate(windows):
        pts = valid_points(samples, window)
        if pts:
            own[i] = np.array(pts)
    members = sorted(own)
    while len(members) >= 2:
        union = np.concatenate([own[i] for i in members])
        if len(set(union[:, 0].tolist())) < 2:
            return None, []
        a, c = fit_affine([tuple(p) for p in union], len(union), cap)
        if a <= 0:
            return None, []
        excess = {}
        for i in members:
            b, t = own[i][:, 0], own[i][:, 1]
            resid = t - (a * passes(b, cap) + c * b)
            se = float(resid.std(ddof=1)) / math.sqrt(len(t)) if len(t) > 1 else math.inf
            excess[i] = abs(float(resid.mean())) - sigmas * se
        worst = max(members, key=lambda i: excess[i])
        if excess[worst] <= 0:
            return (float(a), float(c)), members
        members.remove(worst)
    return None, []


def joint_fits(compute_samples, kinds, caps, window: int, sigmas: float) -> dict[int, tuple[float, float]]:
    """``{rank: (a, c)}`` for the ranks :func:`fit_joint` fits together: those of one finite
    ``kind`` (their CPU limit) and one memory cap. Ranks without a limit that binds (``kind``
    inf) are never grouped: nothing says they run at one speed."""
    groups: dict[tuple, list[int]] = {}
    for i, (kind, cap) in enumerate(zip(kinds, caps)):
        if np.isfinite(kind):
            groups.setdefault((float(kind), cap), []).append(i)
    out = {}
    for (_, cap), ranks in groups.items():
        if len(ranks) > 1:
            fit, members = fit_joint([compute_samples[i] for i in ranks], window, cap, sigmas)
            out.update({ranks[m]: fit for m in members})
    return out


def fit_noise(samples, window: int, cap, a: float, c: float) -> float:
    """Relative standard error of a fit's mean predicted time: the residuals' spread over the
    window, divided by sqrt(n) and by the mean time. Under a CPU quota single steps jitter by up
    to a quota period (measured: 30-50% of a step), so a fit of 8 steps can be 15% off; moves
    smaller than that noise would only chase it."""
    pts = valid_points(samples, window)
    if len(pts) < 3:
        return 0.0
    b = np.array([p[0] for p in pts])
    t = np.array([p[1] for p in pts])
    resid = t - (a * passes(b, cap) + c * b)
    return float(resid.std(ddof=1) / math.sqrt(len(pts)) / t.mean())


def step_time(a, c, b, caps=None, offsets=None) -> np.ndarray:
    """Predicted time of batches ``b``: ``a_i * passes(b_i) + c_i * b_i + offset_i``."""
    b = np.asarray(b, dtype=float)
    return np.asarray(a) * passes(b, caps) + np.asarray(c) * b + (0.0 if offsets is None else np.asarray(offsets))


def predicted_step(model, sizes) -> float:
    """A split's predicted step: its slowest rank's time under ``model = (a, c, caps, offsets)``
    (a rank with 0 samples sits the update out: it takes no time)."""
    times = step_time(*model[:2], sizes, *model[2:])
    return float(np.max(times[np.asarray(sizes) > 0]))


def split_without(model, r: int, total: int) -> list[int]:
    """``total`` samples split over every rank but ``r`` (which gets 0) so that they finish
    together under ``model = (a, c, caps, offsets)``."""
    a, c, caps, offsets = model
    keep = np.arange(len(a)) != r
    cap = None if caps is None else [x for x, k in zip(caps, keep) if k]
    part = solve_equal_finish(np.asarray(a)[keep], np.asarray(c)[keep], total, cap, np.asarray(offsets)[keep])
    sizes = np.zeros(len(a), dtype=int)
    sizes[keep] = round_to_total(part, total, 1)
    return [int(b) for b in sizes]


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

    # sum(sizes(T)) is continuous and non-decreasing in T: bracket the root, then bisect.
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
    # Without caps the bisection fixes which ranks sit at 1 sample; the closed form gives T* exactly.
    if caps is None or np.isinf(cap).all():
        free = sizes(t_lo) > 1.0
        if free.any():
            t_star = (total - (~free).sum() + ((a[free] + o[free]) / c[free]).sum()) / (1.0 / c[free]).sum()
            exact = sizes(t_star)
            if abs(exact.sum() - total) <= 1e-9 * max(total, 1.0):
                b = exact
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


def pool_indistinguishable(
    a, c, noise, b: float, sigmas: float, kinds=None
) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """Ranks whose fits the measurements cannot tell apart share one fit: their mean ``(a, c)``.

    Each rank's predicted time at ``b`` samples (the mean share) is compared, in order, with the
    geometric mean of the group before it; it joins that group when the two differ by at most
    ``sigmas`` standard errors (``noise``: each fit's relative standard error; a group's is the
    root mean square of its members' over the square root of its size). Ranks with the same limit
    then get the same share instead of splitting on their fits' noise, which the deadband would
    freeze (seen: 33,43,51 on three ranks at 0.45 of a core); ranks that really differ stay apart.
    ``sigmas = 0`` pools nothing. ``kinds`` (one value per rank, e.g. its CPU limit) keeps ranks
    known to differ apart: only ranks of one kind are pooled (a rank at 0.17 of a core held at a
    few samples can look like one at 0.5 within the noise of a one-size fit). Returns the new
    ``a``, ``c`` and the groups of more than one rank.

    Usage::

        pool_indistinguishable([0, 0, 0, 0], [1.0, 1.1, 0.95, 3.0], [0.1] * 4, 32, 2.24)
        # -> c = [1.0167, 1.0167, 1.0167, 3.0], groups [[2, 0, 1]]
    """
    a = np.array(a, dtype=float)
    c = np.array(c, dtype=float)
    noise = np.asarray(noise, dtype=float)
    if sigmas <= 0 or a.size < 2:
        return a, c, []
    t = a + c * float(b)
    kinds = [0] * a.size if kinds is None else list(kinds)
    groups: list[list[int]] = []
    for kind in dict.fromkeys(kinds):
        groups += _pool_kind(t, noise, [i for i in range(a.size) if kinds[i] == kind], sigmas)
    pooled = [g for g in groups if len(g) > 1]
    for g in pooled:
        a[g], c[g] = a[g].mean(), c[g].mean()
    return a, c, pooled


def _pool_kind(t: np.ndarray, noise: np.ndarray, ranks: list[int], sigmas: float) -> list[list[int]]:
    order = sorted(ranks, key=lambda i: t[i])
    groups = [[order[0]]]
    for i in order[1:]:
        group = groups[-1]
        center = float(np.exp(np.mean(np.log(t[group]))))
        spread = math.sqrt(float(np.mean(noise[group] ** 2)) / len(group))
        if abs(math.log(t[i] / center)) <= sigmas * math.hypot(noise[i], spread):
            group.append(i)
        else:
            groups.append([i])
    return groups
