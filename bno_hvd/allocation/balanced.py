"""``balanced`` (ours): split a fixed global batch so every rank finishes its step together.

Model. Each rank's local time per update is affine in its batch, ``t_i(b) = a_i + c_i * b`` (``a_i``
s of fixed cost, ``c_i`` s/sample), fitted by :func:`fit_affine` to its recent ``compute_samples``
(compute plus the time before the step: getting the batch, logging).
:func:`solve_equal_finish` finds the common finish time ``T*`` with ``sum_i b_i = G``:
``b_i = (T* - a_i) / c_i``, i.e. ``T* = (G + sum a_i/c_i) / sum 1/c_i``, holding a rank at 1 sample
when the solution leaves that bound. A rank with a memory cap (``max_batch_i`` samples per
forward/backward pass) processes a larger share in ``ceil(b / cap)`` micro-batches with gradient
accumulation: its time is ``a_i * ceil(b / cap_i) + c_i * b``, so the split still equalises finish
times, and the cap never pushes work onto other ranks unless a micro-batch costs more than it saves.

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

Arrival penalty. A rank whose own part of the allreduce is slow (under a CPU quota it has spent
on compute, it is throttled in the middle of the allreduce) makes every rank wait longer whenever
it is the last to arrive. :func:`arrival_penalties` measures that from every rank's sync times
over the last ``arrival_window`` updates (default 64), less ``noise_sigmas`` standard errors (option
``arrival_weight``, default 1; 0 disables), and the rank's share is cut so that it arrives that
much earlier. Emulated or evenly fast ranks have no penalty, also when the allreduce jitters.

Latency. A rank on a slow link receives its allreduce data later, so it should finish compute
earlier. We add to ``a_i`` the rank's mean measured round trip to the other ranks minus the
cluster minimum of that mean, scaled by option ``latency_weight`` (default 1; 0 disables).
A uniform network therefore changes nothing.

Stability. The fitted ``(a_i, c_i)`` (over the last ``window`` steps, default 16) are smoothed
across rebalances by an exponential moving average (option ``smoothing`` = weight of the previous
fit, default 0.5; 0 = no smoothing) - except when a rank's cost per sample changes by more than
1.5x and by more than its measurement noise, which is taken at once - and a deadband (option
``deadband``, default 0.05) keeps ``current`` unless the new split is predicted to shorten the
step - the slowest rank's ``a_i + c_i * b_i`` - by more than that fraction, and by more than
``noise_sigmas`` times the fits' relative standard error (``deadband=0`` disables both). Under
CPU quotas single steps jitter by up to a quota period; the noise term keeps equal ranks from
trading samples on that jitter (Greyhound's rule: rebalance only when it pays). By default it
grows with N (:func:`sigmas_for`: 2.24 for 4 ranks), because the predicted gain follows the
largest of N noisy fits, which noise alone lifts. A
criterion on predicted time rather than on batch sizes ignores moves that only chase measurement
noise (on equal ranks, every move predicts ~0 gain), yet reacts at once when a rank really slows
down.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from ..errors import UsageError
from .metrics import ClusterMetrics
from .rounding import round_to_total
from .strategy import Strategy


def sigmas_for(n_ranks: int, false_moves: float = 0.05) -> float:
    """Standard errors a predicted gain must exceed before ``balanced`` moves samples.

    The gain follows the largest of N noisy fits, and noise alone lifts the largest of N: for
    equal ranks, one false move per ``1 / false_moves`` rebalances needs the one-sided normal
    quantile at ``false_moves / N`` (2.24 for 4 ranks, 3.0 for 64, 3.7 for 1024). A stricter
    budget (0.5%: 3.0 for 4 ranks) kept a rank at 10 samples after its neighbour left (a real
    20% gain was below the threshold); this one moved equal ranks once in four replayed runs."""
    return NormalDist().inv_cdf(1.0 - false_moves / max(int(n_ranks), 1))


def passes(b, cap):
    """Forward/backward passes a batch of ``b`` samples takes under a memory cap (None: one)."""
    b = np.asarray(b, dtype=float)
    if cap is None:
        return np.ones_like(b)
    cap = np.asarray([np.inf if c is None else float(c) for c in np.atleast_1d(cap)]) if np.ndim(cap) else float(cap)
    return np.where(np.isfinite(cap), np.ceil(b / np.where(np.isfinite(cap), cap, 1.0)), 1.0)


def fit_affine(samples, window: int = 8, cap: int | None = None) -> tuple[float, float] | None:
    """Least-squares ``(a, c)`` for ``t = a * passes(b) + c * b`` over the last ``window`` (b, t) pairs.

    ``passes(b) = ceil(b / cap)`` is the number of micro-batches a step of ``b`` samples takes
    under the rank's memory cap (1 without a cap, where this is the affine fit ``t = a + c * b``):
    ``a`` is the fixed cost of one forward/backward pass, ``c`` the cost of one sample. Pairs with
    a non-finite or non-positive value, and outliers (time per sample more than 2x from the
    window's median), are ignored; returns None if none remain.
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


def fit_noise(samples, window: int, cap, a: float, c: float) -> float:
    """Relative standard error of a fit's mean predicted time: the residuals' spread over the
    window, divided by sqrt(n) and by the mean time. Under a CPU quota single steps jitter by up
    to a quota period (measured: 30-50% of a step), so a fit of 8 steps can be 15% off; moves
    smaller than that noise would only chase it."""
    pts = [
        (float(b), float(t))
        for b, t in list(samples)[-window:]
        if math.isfinite(b) and math.isfinite(t) and b > 0 and t > 0
    ]
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
    assert abs(b.sum() - total) <= 1e-6 * max(total, 1.0) + 4 * resolution, (b.sum(), total)
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


class BalancedStrategy(Strategy):
    """Fixed global batch, split so all ranks finish compute at the same time (see module doc)."""

    name = "balanced"
    OPTIONS = {
        "smoothing": 0.5,
        "deadband": 0.05,
        "latency_weight": 1.0,
        "arrival_weight": 1.0,
        "window": 16,
        "noise_sigmas": None,  # None: sigmas_for(n_ranks), 2.24 for 4 ranks
        "arrival_window": 64,
    }
    JUMP = 1.5

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        o = self.options
        _check_range("smoothing", o["smoothing"], 0.0, 1.0, "weight of the previous fit")
        _check_range("deadband", o["deadband"], 0.0, 1.0, "fraction of a rank's batch")
        _check_range("latency_weight", o["latency_weight"], 0.0, math.inf, "0 disables")
        if o["noise_sigmas"] is None:
            self.sigmas = sigmas_for(self.n_ranks)
        else:
            _check_range("noise_sigmas", o["noise_sigmas"], 0.0, math.inf, "0 disables")
            self.sigmas = float(o["noise_sigmas"])
        _check_range("arrival_weight", o["arrival_weight"], 0.0, math.inf, "0 disables")
        for key in ("window", "arrival_window"):
            if isinstance(o[key], bool) or not isinstance(o[key], int) or not 1 <= o[key] <= 10**6:
                raise UsageError(f"balanced {key} must be an integer in [1, 1000000], got {o[key]!r}")
        self.a = np.full(self.n_ranks, np.nan)  # smoothed fits; NaN = never measured
        self.c = np.full(self.n_ranks, np.nan)
        self.noise = np.zeros(self.n_ranks)  # relative standard error of each rank's last fit
        self.penalty = np.zeros(self.n_ranks)  # s a rank adds to the allreduce when it arrives last
        self.sync_rows: dict[int, list[float]] = {}  # update -> every rank's sync seconds (recent updates)

    def rebalance(self, metrics: ClusterMetrics, current: list[int], update: int) -> list[int]:
        self._begin(metrics, current)
        a_fit, c_fit, noise = self._fit(metrics)
        new = np.isfinite(c_fit)
        had = np.isfinite(self.c)
        s = float(self.options["smoothing"])
        self.noise = np.where(new, noise, self.noise)
        # A rank whose fitted cost per sample moved by more than JUMP (x1.5 either way), and by
        # more than its measurement noise, has really changed (a neighbour arrived or left): take
        # the new fit at once instead of smoothing towards it, so the split recovers in one interval.
        ratio = np.where(new & had, c_fit / np.where(had, self.c, 1.0), 1.0)
        beyond_noise = np.abs(np.log(ratio)) > 1.5 * self.sigmas * self.noise
        jumped = new & had & ((ratio > self.JUMP) | (ratio < 1 / self.JUMP)) & beyond_noise
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
        # The penalty needs more updates than a fit: each rank is last in only ~1/N of them.
        self.sync_rows.update(complete_rows(metrics.sync_samples))
        for update in sorted(self.sync_rows)[: -int(self.options["arrival_window"])]:
            del self.sync_rows[update]
        rows = np.array(list(self.sync_rows.values())).reshape(-1, self.n_ranks)
        seen = penalties_from_rows(rows, sigmas=self.sigmas)
        self.penalty = np.where(np.isfinite(seen), seen, self.penalty)  # never last: keep the estimate
        offsets = float(self.options["latency_weight"]) * latency_offsets(metrics.latency_array())
        offsets = offsets + float(self.options["arrival_weight"]) * (self.penalty - self.penalty.min())
        caps = metrics.max_batch
        target = solve_equal_finish(a, c, self.global_batch, caps, offsets)
        sizes = round_to_total(target, self.global_batch, 1)
        model = (a, c, caps, offsets)
        return list(current) if self._within_deadband(sizes, current, model) else sizes

    def _fit(self, metrics: ClusterMetrics) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        window = self.options["window"]
        a = np.full(self.n_ranks, np.nan)
        c = np.full(self.n_ranks, np.nan)
        noise = np.zeros(self.n_ranks)
        for i, (samples, cap) in enumerate(zip(metrics.compute_samples, metrics.max_batch)):
            fit = fit_affine(samples, window, cap)
            if fit is not None:
                a[i], c[i] = fit
                noise[i] = fit_noise(samples, window, cap, *fit)
        ops = metrics.ops_array()
        use_ops = np.isnan(c) & np.isfinite(ops) & (ops > 0)
        a[use_ops] = 0.0
        c[use_ops] = 1.0 / ops[use_ops]
        return a, c, noise

    def _within_deadband(self, sizes: list[int], current: list[int], model) -> bool:
        """True when moving to ``sizes`` is predicted to gain less than ``deadband`` of the step,
        or less than ``noise_sigmas`` times the fits' noise: a move must pay, not chase noise."""
        deadband = float(self.options["deadband"])
        if deadband == 0 or sum(current) != self.global_batch:
            return False  # (current is not a split of this global batch: never keep it)
        threshold = max(deadband, self.sigmas * float(np.sqrt(np.mean(self.noise**2))))
        step_now = float(np.max(step_time(*model[:2], current, *model[2:])))
        step_new = float(np.max(step_time(*model[:2], sizes, *model[2:])))
        return step_now - step_new <= threshold * step_now

    def state_dict(self) -> dict:
        def enc(x):
            return [None if np.isnan(v) else float(v) for v in x]

        rows = [[int(u), [float(x) for x in row]] for u, row in self.sync_rows.items()]
        return {
            **super().state_dict(),
            "a": enc(self.a),
            "c": enc(self.c),
            "penalty": enc(self.penalty),
            "sync_rows": rows,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.a = np.array([np.nan if v is None else float(v) for v in state["a"]])
        self.c = np.array([np.nan if v is None else float(v) for v in state["c"]])
        self.penalty = np.array([0.0 if v is None else float(v) for v in state.get("penalty", [0.0] * self.n_ranks)])
        self.sync_rows = {int(u): [float(x) for x in row] for u, row in state.get("sync_rows", [])}


def arrival_penalties(sync_samples, min_count: int = 3, sigmas: float = 2.0) -> np.ndarray:
    """Seconds each rank adds to the allreduce when it is the last to arrive (NaN: not seen often
    enough to tell), from every rank's recent ``(update, sync seconds)``.

    In an update every rank waits in the allreduce until the last one arrives, and the allreduce
    then ends on all ranks together, so the shortest sync time of the update is the allreduce
    itself and belongs to the rank that arrived last. A rank whose own part of the allreduce is
    slow (a CPU quota it already spent on compute) makes that shortest time longer whenever it is
    the last: the mean of those updates minus the mean of the others is its penalty. Giving
    the rank that much less compute lets it arrive earlier. Only durations enter, each timed on
    its own rank, so no common clock is needed.

    The penalty is that difference less ``sigmas`` standard errors (Welch), and 0 below that:
    under CPU quotas the allreduce jitters by several ms (a quota period hit or not), and on
    equal ranks a "penalty" of noise moved samples back and forth (measured: 0.88x equal on four
    ranks at 0.5 of a core). :class:`BalancedStrategy` keeps the rows of its last
    ``arrival_window`` updates, since each rank is last in only about 1/N of them.
    """
    rows = list(complete_rows(sync_samples).values())
    return penalties_from_rows(np.array(rows).reshape(-1, len(sync_samples)), min_count, sigmas)


def complete_rows(sync_samples) -> dict[int, list[float]]:
    """``{update: [sync seconds of rank 0, 1, ...]}`` for the updates every rank reported."""
    n = len(sync_samples)
    by_update: dict[int, dict[int, float]] = {}
    for rank, pairs in enumerate(sync_samples):
        for update, seconds in pairs:
            if math.isfinite(seconds) and seconds >= 0:
                by_update.setdefault(int(update), {})[rank] = float(seconds)
    return {u: [v[r] for r in range(n)] for u, v in by_update.items() if len(v) == n}


def penalties_from_rows(sync: np.ndarray, min_count: int = 3, sigmas: float = 2.0) -> np.ndarray:
    """:func:`arrival_penalties` from an (updates x ranks) array of sync seconds."""
    n = sync.shape[1]
    out = np.full(n, np.nan)
    if n < 2 or sync.shape[0] < 2 * min_count:
        return out
    allreduce, last = sync.min(axis=1), sync.argmin(axis=1)
    for i in range(n):
        mine = last == i
        if mine.sum() >= min_count and (~mine).sum() >= min_count:
            own, others = allreduce[mine], allreduce[~mine]
            # Welch's standard error of the difference of the means; throttling makes the
            # allreduce bimodal (a quota period hit or not), so medians of small groups jump
            se = math.sqrt(own.var(ddof=1) / own.size + others.var(ddof=1) / others.size)
            out[i] = max(0.0, float(own.mean() - others.mean()) - sigmas * se)
    return out


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
