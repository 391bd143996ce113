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
it is the last to arrive. :func:`~bno_hvd.allocation.offsets.arrival_penalties` measures that
from every rank's sync times over the last ``arrival_window`` updates (default 64), less
``noise_sigmas`` standard errors (option ``arrival_weight``, default 1; 0 disables), and the
rank's share is cut so that it arrives that much earlier. Emulated or evenly fast ranks have no
penalty, also when the allreduce jitters.

Throttled sync. Under a CPU limit below one core (a cgroup quota: a container's CPU limit, a
neighbour's share, ``--cpu-quota``), a rank pays its part of the allreduce at its limit's rate,
and every rank waits for it. Each rank reports its cgroup's limit and the CPU of its sync phases;
:func:`throttle_offsets` charges a throttled rank the extra time (option ``throttle_weight``,
default 1; 0 disables), so it gets less compute and starts the sync early enough
(measured: ~20% faster updates than the split that equalises compute). Unthrottled ranks get nothing.

A rank's fit at one batch size splits its time by the shape (fixed cost in samples) its last
fit over two sizes had (:meth:`_fit`). A rank whose CPU limit rose (or stopped binding: a
neighbour left) loses its fit at once and gets a typical rank's share until it is measured again
(probes, more samples for a small rank to measure it, paid on no profile and were removed).

Sitting out. Where the loop allows it (bno-hvd's own loop: :mod:`bno_hvd.library.catchup`),
one rank (never rank 0) may get 0 samples and leave the allreduce: when the model predicts the
others finish sooner without it, or when it gets less than ``starved_share`` (default 0.5) of the
others' share of the CPU (run time over runnable time, and CPU per wall second) and one interval
without it is *measured* faster (a trial). It is back when its limit rises, when its return pays,
and after ``sit_out`` rebalances (default 4; 0: never sits out) to be measured again
(:mod:`bno_hvd.allocation.sitting`).

Pooling. Ranks whose predicted times at the mean share differ by less than ``pool_sigmas``
standard errors of their fits (default: ``noise_sigmas``; 0 disables) share one fit, their mean
(:func:`~bno_hvd.allocation.fitting.pool_indistinguishable`): ranks with the same limit get the
same share: a split the deadband keeps is evened out within each group (:func:`even_out`).
Ranks under one CPU limit are first fitted together
(:func:`~bno_hvd.allocation.fitting.joint_fits`): one rank held at one size cannot resolve its
fixed cost, and its fit through the origin makes the rank with fewer samples look slower per
sample (47,32,47 at a 100 ms CFS period); their steps together span several sizes. A rank whose
steps differ from the joint fit beyond ``pool_sigmas`` standard errors keeps its own fit.

Latency. A rank on a slow link receives its allreduce data later, so it should finish compute
earlier. We add to ``a_i`` the rank's cheapest measured round trip to another rank minus the
cluster minimum of that, scaled by option ``latency_weight`` (default 1; 0 disables). A uniform
network therefore changes nothing, nor does a starved rank to the ranks that ping it.

Stability. The fitted ``(a_i, c_i)`` (over the last ``window`` steps, default 16) are smoothed
across rebalances by an exponential moving average (option ``smoothing`` = weight of the previous
fit, default 0.5; 0 = no smoothing) - except when a rank's cost per sample changes by more than
option ``jump`` (default 1.5x) and by more than its measurement noise, which is taken at once (a
rank back from sitting out at 50x its old speed would otherwise look slow for five intervals and
sit out again) - and a deadband (option ``deadband``, default 0.05) keeps
``current`` unless the new split is predicted to shorten the step - the slowest rank's ``a_i +
c_i * b_i`` - by more than that fraction, and by more than ``noise_sigmas`` times the fits'
relative standard error (``deadband=0`` disables both). Under
CPU quotas single steps jitter by up to a quota period; the noise term keeps equal ranks from
trading samples on that jitter (Greyhound's rule: rebalance only when it pays). By default it
grows with N (:func:`sigmas_for`: 2.24 for 4 ranks): the predicted gain follows the largest of
N noisy fits, which noise alone lifts. A criterion on predicted time ignores moves that only
chase noise (on equal ranks every move predicts ~0 gain), yet reacts when a rank slows down.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from bno_hvd.allocation.fitting import (
    fit_affine,
    fit_noise,
    joint_fits,
    passes,
    pool_indistinguishable,
    predicted_step,
    solve_equal_finish,
)
from bno_hvd.allocation.metrics import ClusterMetrics
from bno_hvd.allocation.offsets import (
    complete_rows,
    fmt_limit,
    in_ms,
    latency_offsets,
    limit_changed,
    penalties_from_rows,
    throttle_offsets,
)
from bno_hvd.allocation.rounding import even_out, round_to_total
from bno_hvd.allocation.sitting import SitOuts
from bno_hvd.allocation.strategy import Strategy
from bno_hvd.common.errors import UsageError


def sigmas_for(n_ranks: int, false_moves: float = 0.05) -> float:
    """Standard errors a predicted gain must exceed before ``balanced`` moves samples.

    The gain follows the largest of N noisy fits, and noise alone lifts the largest of N: for
    equal ranks, one false move per ``1 / false_moves`` rebalances needs the one-sided normal
    quantile at ``false_moves / N`` (2.24 for 4 ranks, 3.0 for 64, 3.7 for 1024). A stricter
    budget (0.5%: 3.0 for 4 ranks) kept a rank at 10 samples after its neighbour left (a real
    20% gain was below the threshold); this one moved equal ranks once in four replayed runs."""
    return NormalDist().inv_cdf(1.0 - false_moves / max(int(n_ranks), 1))


class EqualFinishStrategy(Strategy):
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
        "throttle_weight": 1.0,
        "sit_out": 4,  # rebalances a rank that costs more than it adds stays out; 0: never sits out
        "pool_sigmas": None,  # None: noise_sigmas; ranks whose fits differ by less share one; 0: never
        "starved_share": 0.5,  # a rank with less CPU share than this of the others' is tried out; 0: never
        "jump": 1.5,  # a cost per sample that moved by more than this factor is taken at once, not smoothed
    }

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
        if o["pool_sigmas"] is None:
            self.pool_sigmas = self.sigmas
        else:
            _check_range("pool_sigmas", o["pool_sigmas"], 0.0, math.inf, "0 disables")
            self.pool_sigmas = float(o["pool_sigmas"])
        _check_range("arrival_weight", o["arrival_weight"], 0.0, math.inf, "0 disables")
        _check_range("throttle_weight", o["throttle_weight"], 0.0, math.inf, "0 disables")
        if isinstance(o["sit_out"], bool) or not isinstance(o["sit_out"], int) or o["sit_out"] < 0:
            raise UsageError(f"balanced sit_out must be an integer >= 0 (0: never), got {o['sit_out']!r}")
        _check_range("starved_share", o["starved_share"], 0.0, 1.0, "of the others' CPU share; 0 disables")
        _check_range("jump", o["jump"], 1.0, math.inf, "factor; 1 takes every change at once")
        for key in ("window", "arrival_window"):
            if isinstance(o[key], bool) or not isinstance(o[key], int) or not 1 <= o[key] <= 10**6:
                raise UsageError(f"balanced {key} must be an integer in [1, 1000000], got {o[key]!r}")
        self.a = np.full(self.n_ranks, np.nan)  # smoothed fits; NaN = never measured
        self.c = np.full(self.n_ranks, np.nan)
        self.noise = np.zeros(self.n_ranks)  # relative standard error of each rank's last fit
        self.penalty = np.zeros(self.n_ranks)  # s a rank adds to the allreduce when it arrives last
        self.sync_rows: dict[int, list[float]] = {}  # update -> every rank's sync seconds (recent updates)
        self.shape = np.full(self.n_ranks, np.nan)  # a_i / c_i of each rank's last resolved fit (samples)
        self.limits = np.full(self.n_ranks, np.nan)  # each rank's CPU limit at the last rebalance; inf = none
        self.sitouts = SitOuts(o["sit_out"], o["starved_share"])

    def rebalance(self, metrics: ClusterMetrics, current: list[int], update: int) -> list[int]:
        self._begin(metrics, current)
        limits = np.array([np.inf if x is None else float(x) for x in metrics.cpu_limit])
        rose = limit_changed(self.limits, limits) & ~(limits < self.limits)  # raised, or no longer binding
        rose_notes = [
            f"rank {i}'s CPU limit rose from {fmt_limit(self.limits[i])} to {fmt_limit(limits[i])}"
            for i in np.flatnonzero(rose)
        ]
        self.limits = limits
        kinds = np.round(np.log(limits), 1)  # ranks whose CPU limits differ are never pooled (inf: none)
        a_fit, c_fit, noise = self._fit(metrics, kinds)
        new = np.isfinite(c_fit)
        had = np.isfinite(self.c)
        s = float(self.options["smoothing"])
        # A rank whose fitted cost per sample moved by more than `jump` (x1.5 either way), and by
        # more than its measurement noise, has really changed (a neighbour left, a rank is back from
        # sitting out at a new speed): take the new fit at once instead of smoothing towards it.
        ratio = np.where(new & had, c_fit / np.where(had, self.c, 1.0), 1.0)
        beyond_noise = np.abs(np.log(ratio)) > 1.5 * self.sigmas * self.noise
        jump = float(self.options["jump"])
        jumped = new & had & ((ratio > jump) | (ratio < 1 / jump)) & beyond_noise
        both, first = new & had & ~jumped, (new & ~had) | jumped
        self.a[both] = s * self.a[both] + (1 - s) * a_fit[both]
        self.c[both] = s * self.c[both] + (1 - s) * c_fit[both]
        self.a[first], self.c[first] = a_fit[first], c_fit[first]
        self.noise = np.where(new, noise, self.noise)
        # A rank whose limit rose runs faster than any of its old steps show (a one-size fit at 1
        # sample cannot tell how much): forget its fit, so it gets a typical rank's share and is
        # measured there in the next interval (in the REAL suite: back within one interval). Its
        # arrivals at the allreduce before are as old: they are measured again too.
        self.a[rose], self.c[rose], self.shape[rose], self.noise[rose] = np.nan, np.nan, np.nan, 0.0
        if rose.any():
            self.sync_rows, self.penalty[rose] = {}, 0.0
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
        for old in sorted(self.sync_rows)[: -int(self.options["arrival_window"])]:
            del self.sync_rows[old]  # (not `update`: that is this rebalance's, which the sit-outs read)
        rows = np.array(list(self.sync_rows.values())).reshape(-1, self.n_ranks)
        seen = penalties_from_rows(rows, self.sigmas)
        self.penalty = np.where(np.isfinite(seen), seen, self.penalty)  # never last: keep the estimate
        parts = {
            "latency_ms": float(self.options["latency_weight"]) * latency_offsets(metrics.latency_array()),
            "arrival_ms": float(self.options["arrival_weight"]) * (self.penalty - self.penalty.min()),
            "throttle_ms": float(self.options["throttle_weight"])
            * throttle_offsets(metrics.sync_cpu, metrics.cpu_limit),
        }
        offsets = sum(parts.values())
        caps = metrics.max_batch
        share = self.global_batch / self.n_ranks
        a, c, pooled = pool_indistinguishable(a, c, self.noise, share, self.pool_sigmas, kinds)
        model = (a, c, caps, offsets)
        self.last_model = in_ms({"fixed_ms": a, "per_sample_ms": c, **parts})  # updates.jsonl: why this split
        for key in ("cpu_share", "cpu_per_wall"):
            self.last_model[key] = [None if x is None else round(float(x), 3) for x in getattr(metrics, key)]
        sizes = round_to_total(solve_equal_finish(a, c, self.global_batch, caps, offsets), self.global_batch, 1)
        moved = None
        if self.sit_out_ok and int(self.options["sit_out"]) > 0 and self.n_ranks > 1:
            settled = self._within_deadband(sizes, current, model)  # a trial is measured against the fit's split
            at = (update, self.global_batch, self._threshold(), self.sigmas, settled)
            sizes, moved, back = self.sitouts.decide(model, sizes, current, known, metrics, *at)
            if back is not None:  # its arrivals at the allreduce are measured again
                self.sync_rows, self.penalty[back] = {}, 0.0
        if rose_notes or moved or not self._within_deadband(sizes, current, model):
            if moved or rose_notes:
                dropped = "; ".join(rose_notes) + ": its old fit is dropped (a typical share until measured)"
                self.last_note = moved or dropped
            return sizes
        kept = list(current)
        groups = [[i for i in g if kept[i] > 0] for g in pooled]  # never one that sits out
        even = even_out(kept, groups)  # never a predicted slowdown:
        return even if predicted_step(model, even) <= predicted_step(model, kept) else kept

    def _fit(self, metrics: ClusterMetrics, kinds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        window = self.options["window"]
        a = np.full(self.n_ranks, np.nan)
        c = np.full(self.n_ranks, np.nan)
        noise = np.zeros(self.n_ranks)
        joint = joint_fits(metrics.compute_samples, kinds, metrics.max_batch, window, self.pool_sigmas)
        for i, (samples, cap) in enumerate(zip(metrics.compute_samples, metrics.max_batch)):
            fit = joint.get(i) or fit_affine(samples, window, cap)
            if fit is None:
                continue
            sizes = {float(b) for b, _ in list(samples)[-window:]}
            if fit[0] > 0:
                self.shape[i] = fit[0] / fit[1]  # resolved: remember its fixed cost in samples
            elif len(sizes) == 1 and np.isfinite(self.shape[i]):
                # One size: the origin fit would charge the fixed cost per sample. Split the time
                # by the shape this rank showed when it last ran two sizes (under a CPU quota
                # fixed and per-sample costs scale together, so the shape outlives a new quota).
                b = sizes.pop()
                fixed = self.shape[i] * float(passes(b, cap))
                fit = (fit[1] * b * self.shape[i] / (fixed + b), fit[1] * b / (fixed + b))
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
        if float(self.options["deadband"]) == 0 or sum(current) != self.global_batch:
            return False  # (current is not a split of this global batch: never keep it)
        threshold = self._threshold()
        step_now, step_new = predicted_step(model, current), predicted_step(model, sizes)
        return step_now - step_new <= threshold * step_now

    def _threshold(self) -> float:
        """The predicted gain a move must exceed: ``deadband``, or the fits' noise if larger."""
        return max(float(self.options["deadband"]), self.sigmas * float(np.sqrt(np.mean(self.noise**2))))

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
            "sitouts": self.sitouts.state_dict(),
            "shape": enc(self.shape),
            "limits": [None if np.isnan(v) else ("none" if np.isinf(v) else float(v)) for v in self.limits],
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.a = np.array([np.nan if v is None else float(v) for v in state["a"]])
        self.c = np.array([np.nan if v is None else float(v) for v in state["c"]])
        self.penalty = np.array([0.0 if v is None else float(v) for v in state.get("penalty", [0.0] * self.n_ranks)])
        self.sync_rows = {int(u): [float(x) for x in row] for u, row in state.get("sync_rows", [])}
        self.sitouts.load_state_dict(state.get("sitouts", {"out_for": state.get("out_for", 0)}))
        self.shape = np.array([np.nan if v is None else float(v) for v in state.get("shape", [None] * self.n_ranks)])
        limits = state.get("limits", [None] * self.n_ranks)
        self.limits = np.array([np.nan if v is None else (np.inf if v == "none" else float(v)) for v in limits])


def _check_range(name: str, value, low: float, high: float, meaning: str) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value < high
    if not ok:
        raise UsageError(f"balanced {name} must be in [{low:g}, {high:g}) ({meaning}), got {value!r}")
