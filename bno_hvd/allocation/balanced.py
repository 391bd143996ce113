"""``balanced`` (ours): split a fixed global batch so every rank finishes its step together.

Model. Each rank's compute time is affine in its batch, ``t_i(b) = a_i + c_i * b`` (``a_i`` s of
fixed cost, ``c_i`` s/sample), fitted by :func:`fit_affine` to its recent ``compute_samples``.
:func:`solve_equal_finish` finds the common finish time ``T*`` with ``sum_i b_i = G``:
``b_i = (T* - a_i) / c_i``, i.e. ``T* = (G + sum a_i/c_i) / sum 1/c_i``, and holds a rank at
1 or at its memory cap ``max_batch_i`` when the solution leaves those bounds, re-solving the rest.

Fallbacks, so a rank is never starved or crashes the run:

* all samples at one batch size (or a fit with ``c <= 0`` or ``a < 0``, which is noise, or one
  whose per-sample cost is below 0.1% of its fixed cost, ``c * mean(b) < 1e-3 * a``, which the
  window cannot resolve and whose near-zero ``c`` would hand this rank an unbounded batch that
  float64 cannot even solve for): fit through the origin, ``a = 0``,
  ``c = sum(t*b) / sum(b^2)`` (= t/b for a single size);
* no usable samples: ``c = 1 / ops``, ``a = 0``;
* no samples and no ops this round: keep that rank's previous fit; if it never had one, use the
  median fit of the other ranks (and set ``last_warning``). If no rank has ever been measured,
  keep ``current``.

Latency. A rank on a slow link receives its allreduce data later, so it should finish compute
earlier. We add to ``a_i`` the rank's mean measured round trip to the other ranks minus the
cluster minimum of that mean, scaled by option ``latency_weight`` (default 1; 0 disables).
A uniform network therefore changes nothing.

Stability. The fitted ``(a_i, c_i)`` are smoothed across rebalances by an exponential moving
average (option ``smoothing`` = weight of the previous fit, default 0.5; 0 = no smoothing) - except
when a rank's cost per sample changes by more than 1.5x, which is taken at once - and a
deadband (option ``deadband``, default 0.05) keeps ``current`` unless the new split is predicted
to shorten the step - the slowest rank's ``a_i + c_i * b_i`` - by more than that fraction
(``deadband=0`` disables it). A criterion on predicted time rather than on batch sizes ignores
moves that only chase measurement noise (on equal ranks, every move predicts ~0 gain), yet
reacts at once when a rank really slows down.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import UsageError
from .metrics import ClusterMetrics
from .rounding import round_to_total
from .strategy import Strategy


def fit_affine(samples, window: int = 8) -> tuple[float, float] | None:
    """Least-squares ``(a, c)`` for ``t = a + c * b`` over the last ``window`` (b, t) pairs.

    Pairs with a non-finite or non-positive value, and outliers (time per sample more than 2x
    from the window's median), are ignored; returns None if none remain.
    """
    pts = [
        (float(b), float(t))
        for b, t in list(samples)[-window:]
        if math.isfinite(b) and math.isfinite(t) and b > 0 and t > 0
    ]
    if not pts:
        return None
    # A machine-wide hiccup (page faults, a noisy neighbour) can make one step several times
    # slower on every rank; it says nothing about a rank's speed. Drop steps whose time per
    # sample is more than 2x away from the window's median. A real slowdown becomes the median
    # once it fills half the window, and then the old steps are the ones dropped.
    med = float(np.median([t / b for b, t in pts]))
    pts = [(b, t) for b, t in pts if med / 2 <= t / b <= 2 * med]
    n = len(pts)
    mean_b = sum(b for b, _ in pts) / n
    mean_t = sum(t for _, t in pts) / n
    sxx = sum((b - mean_b) ** 2 for b, _ in pts)
    if sxx > 0:
        c = sum((b - mean_b) * (t - mean_t) for b, t in pts) / sxx
        a = mean_t - c * mean_b
        if c > 0 and a >= 0 and c * mean_b >= 1e-3 * a:
            return a, c
    return 0.0, sum(b * t for b, t in pts) / sum(b * b for b, _ in pts)


def solve_equal_finish(a, c, total: float, max_batch=None) -> list[float]:
    """Real batch sizes ``b_i`` in ``[1, max_batch_i]`` summing to ``total`` with equal finish time.

    Every rank not held at a bound finishes at the same ``T*``: ``a_i + c_i * b_i == T*``.
    Usage::

        solve_equal_finish([0.1, 0.2, 0.0, 0.05], [0.01, 0.02, 0.005, 0.01], 100, [None, None, 40, None])
        # -> [24.0, 7.0, 40.0, 29.0] (up to float rounding); T* = 0.34 s
    """
    a = np.asarray(a, dtype=float)
    c = np.asarray(c, dtype=float)
    n = a.size
    if c.shape != (n,) or n == 0 or not (np.isfinite(a).all() and np.isfinite(c).all()) or (c <= 0).any():
        raise UsageError("solve_equal_finish needs N finite a_i and N finite c_i > 0")
    lo = np.ones(n)
    hi = np.full(n, np.inf) if max_batch is None else np.array([np.inf if m is None else float(m) for m in max_batch])
    if hi.shape != (n,) or (hi < 1).any():
        raise UsageError("max_batch needs one cap >= 1 (or None) per rank")
    if not n <= total <= hi.sum():
        raise UsageError(
            f"global batch {total} does not fit {n} ranks between 1 sample and their memory "
            f"caps (sum {hi.sum():g}); change the global batch"
        )

    def sizes(t: float) -> np.ndarray:
        return np.clip((t - a) / c, lo, hi)

    # sum(sizes(T)) is continuous and non-decreasing in T: bracket the root, then bisect.
    t_lo = float((a + c * lo).min())
    t_hi = float((a + c * np.minimum(hi, total)).max())
    for _ in range(200):
        mid = 0.5 * (t_lo + t_hi)
        if mid <= t_lo or mid >= t_hi:
            break
        if sizes(mid).sum() < total:
            t_lo = mid
        else:
            t_hi = mid
    # Bisection fixes which ranks sit at a bound; the closed form then gives T* exactly.
    b_lo, b_hi = sizes(t_lo), sizes(t_hi)
    held = (b_lo == b_hi) & ((b_hi == lo) | (b_hi == hi))
    free = ~held
    b = b_hi
    if free.any():
        t_star = (total - b_hi[held].sum() + (a[free] / c[free]).sum()) / (1.0 / c[free]).sum()
        exact = sizes(t_star)
        if abs(exact.sum() - total) <= 1e-9 * max(total, 1.0):
            b = exact
    # Exact up to float64: one step of T moves rank i by spacing(T) / c_i samples, which is more
    # than 1e-6 of the total when a large fixed cost (a slow link) meets a tiny c.
    resolution = n * np.spacing(max(abs(t_lo), abs(t_hi))) / c.min()
    assert abs(b.sum() - total) <= 1e-6 * max(total, 1.0) + 4 * resolution, (b.sum(), total)
    return b.tolist()


class BalancedStrategy(Strategy):
    """Fixed global batch, split so all ranks finish compute at the same time (see module doc)."""

    name = "balanced"
    OPTIONS = {"smoothing": 0.5, "deadband": 0.05, "latency_weight": 1.0, "window": 8}
    JUMP = 1.5

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        o = self.options
        _check_range("smoothing", o["smoothing"], 0.0, 1.0, "weight of the previous fit")
        _check_range("deadband", o["deadband"], 0.0, 1.0, "fraction of a rank's batch")
        _check_range("latency_weight", o["latency_weight"], 0.0, math.inf, "0 disables")
        if isinstance(o["window"], bool) or not isinstance(o["window"], int) or o["window"] < 1:
            raise UsageError(f"balanced window must be an integer >= 1, got {o['window']!r}")
        self.a = np.full(self.n_ranks, np.nan)  # smoothed fits; NaN = never measured
        self.c = np.full(self.n_ranks, np.nan)

    def rebalance(self, metrics: ClusterMetrics, current: list[int], update: int) -> list[int]:
        self._begin(metrics, current)
        a_fit, c_fit = self._fit(metrics)
        new = np.isfinite(c_fit)
        had = np.isfinite(self.c)
        s = float(self.options["smoothing"])
        # A rank whose fitted cost per sample moved by more than JUMP (x1.5 either way) has
        # really changed (a neighbour arrived or left): take the new fit at once instead of
        # smoothing towards it, so the split recovers in one rebalance interval.
        ratio = np.where(new & had, c_fit / np.where(had, self.c, 1.0), 1.0)
        jumped = new & had & ((ratio > self.JUMP) | (ratio < 1 / self.JUMP))
        both, first = new & had & ~jumped, (new & ~had) | jumped
        self.a[both] = s * self.a[both] + (1 - s) * a_fit[both]
        self.c[both] = s * self.c[both] + (1 - s) * c_fit[both]
        self.a[first], self.c[first] = a_fit[first], c_fit[first]
        known = np.isfinite(self.c)
        if not known.any():
            self._warn("balanced: no rank has reported compute times or throughput yet; kept the current allocation")
            return list(current)
        if not new.all():
            self._warn(
                f"balanced: no usable measurements from rank(s) {np.flatnonzero(~new).tolist()}; "
                "using their previous fit (or the cluster median)"
            )
        # Unknown ranks are treated as typical, not stored: their own fit replaces this later.
        a = np.where(known, self.a, np.median(self.a[known]))
        c = np.where(known, self.c, np.median(self.c[known]))
        a = a + float(self.options["latency_weight"]) * latency_offsets(metrics.latency_array())
        caps = metrics.max_batch
        target = solve_equal_finish(a, c, self.global_batch, caps)
        sizes = round_to_total(target, self.global_batch, 1, caps)
        return list(current) if self._within_deadband(sizes, current, caps, a, c) else sizes

    def _fit(self, metrics: ClusterMetrics) -> tuple[np.ndarray, np.ndarray]:
        window = self.options["window"]
        a = np.full(self.n_ranks, np.nan)
        c = np.full(self.n_ranks, np.nan)
        for i, samples in enumerate(metrics.compute_samples):
            fit = fit_affine(samples, window)
            if fit is not None:
                a[i], c[i] = fit
        ops = metrics.ops_array()
        use_ops = np.isnan(c) & np.isfinite(ops) & (ops > 0)
        a[use_ops] = 0.0
        c[use_ops] = 1.0 / ops[use_ops]
        return a, c

    def _within_deadband(self, sizes: list[int], current: list[int], caps, a, c) -> bool:
        """True when moving to ``sizes`` is predicted to gain less than ``deadband`` of the step."""
        deadband = float(self.options["deadband"])
        cur = np.asarray(current, dtype=float)
        if deadband == 0:
            return False
        if cur.sum() != self.global_batch or any(cap is not None and b > cap for b, cap in zip(current, caps)):
            return False  # current is not a valid split of this global batch: never keep it
        step_now = float(np.max(a + c * cur))
        step_new = float(np.max(a + c * np.asarray(sizes, dtype=float)))
        return step_now - step_new <= deadband * step_now

    def state_dict(self) -> dict:
        def enc(x):
            return [None if np.isnan(v) else float(v) for v in x]

        return {**super().state_dict(), "a": enc(self.a), "c": enc(self.c)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.a = np.array([np.nan if v is None else float(v) for v in state["a"]])
        self.c = np.array([np.nan if v is None else float(v) for v in state["c"]])


def latency_offsets(latency: np.ndarray) -> np.ndarray:
    """Seconds to add to each rank's fixed cost: mean round trip to others minus the cluster min.

    Non-finite entries are ignored; a rank with no finite entry (or a single rank) gets 0.
    """
    n = latency.shape[0]
    if n < 2 or latency.shape != (n, n):
        return np.zeros(n)
    finite = np.isfinite(latency)
    if finite.all():  # the usual case: no NxN float temporaries
        mean = (latency.sum(axis=1) - np.diagonal(latency)) / (n - 1)
    else:
        np.fill_diagonal(finite, False)  # a rank's latency to itself says nothing about its links
        count = finite.sum(axis=1)
        total = np.where(finite, latency, 0.0).sum(axis=1)
        mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    if not np.isfinite(mean).any():
        return np.zeros(n)
    return np.where(np.isfinite(mean), mean - np.nanmin(mean), 0.0)


def _check_range(name: str, value, low: float, high: float, meaning: str) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value < high
    if not ok:
        raise UsageError(f"balanced {name} must be in [{low:g}, {high:g}) ({meaning}), got {value!r}")
