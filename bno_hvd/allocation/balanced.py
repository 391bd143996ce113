"""``balanced`` (ours): split a fixed global batch so that every rank finishes its update together.

**One model.** Rank i's update takes ``t_i(b) = c_i * (k * passes_i(b) + b) + s_i`` seconds. Every
rank does the same work, a fixed cost worth ``k`` samples per pass (``passes``: micro-batches under
a memory cap) and ``b`` samples, at its own speed ``1 / c_i``; ``k`` and ``c_i`` are fitted to the
ranks' last ``window`` steps (:func:`fit_shape`; ranks that report one CPU limit share one ``c``).
``s_i`` is its part of the allreduce paid at its CPU limit ``L_i``, ``w * (1 / L_i - 1)`` beyond the
least of them (:func:`throttle_offsets`; a rank out: as in the last set it was in, not the smaller
ring left in), and no less than what of the slowest part starts after
the last arrival: waiting buys back one CFS period's budget (:func:`~.fitting.in_set`). A rank
without measurements, or whose limit rose (its steps are from before), counts as a typical rank
(the median fit) until it is measured again; one measured only at one size of at most half the
typical share is no faster per sample than that rank until measured at a second size.

**One rule.** Take the split the model predicts fastest - every rank finishing together
(:func:`~.fitting.solve_equal_finish`) or, where the loop allows it, the k ranks slowest at one sample (never
rank 0) sitting the update out (:mod:`.sitting`) - when it is predicted to shorten the update by
more than ``deadband`` (5%; a rank out comes back on the model's word at twice that: its fit is
from before it left). What the model cannot see is measured: a rank with no CPU limit
that binds and less than ``starved_share`` of the others' share of the CPU is tried out for one
interval and stays out if the updates were faster without it. Ranks out are back at once when
their limit rises; with no limit that binds, they are measured again after ``sit_out``
rebalances (twice as long each time they were right to leave).
Options, constants and the ablation behind each part: docs/heterogeneity.md.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from bno_hvd.allocation.fitting import fit_shape, predicted_step, split_without, valid_points
from bno_hvd.allocation.metrics import ClusterMetrics
from bno_hvd.allocation.offsets import beyond_budget, fmt_limit, in_ms, least_sync_cpu, throttle_offsets
from bno_hvd.allocation.sitting import SitOuts
from bno_hvd.allocation.strategy import Strategy
from bno_hvd.common.errors import UsageError

# options of the old balanced, refused with one line (docs/heterogeneity.md has the ablation that removed them)
REMOVED = ("smoothing", "jump", "latency_weight", "arrival_weight", "arrival_window", "throttle_weight")
REMOVED += ("noise_sigmas", "pool_sigmas")


def sigmas_for(n_ranks: int, false_moves: float = 0.05) -> float:
    """Standard errors a measured gain (a trial of a rank sitting out) must exceed: the one-sided
    normal quantile at ``false_moves / N`` (2.24 for 4 ranks, 3.0 for 64), so that equal ranks
    are kept out on noise in about ``false_moves`` of their trials at any N."""
    return NormalDist().inv_cdf(1.0 - false_moves / max(int(n_ranks), 1))


class EqualFinishStrategy(Strategy):
    """Fixed global batch, split so all ranks finish their update together (see the module doc)."""

    name = "balanced"
    OPTIONS = {
        "window": 16,  # recent steps per rank in each fit
        "deadband": 0.05,  # the least predicted gain (a fraction of the update) worth a move
        "sit_out": 4,  # rebalances a rank out (no limit that binds) stays out before it is measured again; 0: never
        "starved_share": 0.5,  # a rank below this of the others' CPU share is tried out; 0: no trials
    }

    def __init__(self, *args, **kwargs):
        gone = [k for k in kwargs if k in REMOVED]
        if gone:
            raise UsageError(
                f"balanced has no option {gone[0]!r} any more (one model, one rule: docs/heterogeneity.md); "
                f"valid options: {', '.join(sorted(self.OPTIONS))}"
            )
        super().__init__(*args, **kwargs)
        o = self.options
        _check_number("deadband", o["deadband"], 0.0, 1.0, "a fraction of the update")
        _check_number("starved_share", o["starved_share"], 0.0, 1.0, "of the others' CPU share; 0: no trials")
        for key, low in (("window", 1), ("sit_out", 0)):
            if isinstance(o[key], bool) or not isinstance(o[key], int) or not low <= o[key] <= 10**6:
                raise UsageError(f"balanced {key} must be an integer in [{low}, 1000000], got {o[key]!r}")
        self.sigmas = sigmas_for(self.n_ranks)
        self.shape = 0.0  # the fixed cost of a pass, in samples (fit_shape)
        self.limits = np.full(self.n_ranks, np.nan)  # each rank's CPU limit at the last rebalance; inf: none
        self.work_in = np.full(self.n_ranks, np.nan)  # w (throttle_offsets) at the last rebalance each rank was in
        self.sitouts = SitOuts(o["sit_out"], o["starved_share"])

    def rebalance(self, metrics: ClusterMetrics, current: list[int], update: int) -> list[int]:
        self._begin(metrics, current)
        limits = np.array([np.inf if x is None else float(x) for x in metrics.cpu_limit])
        rose = self._rose(limits)
        notes = [f"rank {i}'s CPU limit rose from {fmt_limit(self.limits[i])} to {fmt_limit(limits[i])}" for i in rose]
        self.limits = limits
        a, c = self._fit(metrics, limits)
        if not np.isfinite(c).all():
            missing = np.flatnonzero(~np.isfinite(c)).tolist()
            self._warn(f"balanced: no usable measurements from rank(s) {missing}; counted as a typical rank")
        a[rose], c[rose] = np.nan, np.nan  # measured under the old limit
        known = np.isfinite(c)
        if not known.any():
            self._warn("balanced: no rank has reported compute times or throughput yet; kept the current allocation")
            return list(current)
        a, c = np.where(known, a, np.median(a[known])), np.where(known, c, np.median(c[known]))
        offsets = self._offsets(metrics, np.asarray(current) == 0)
        model = (a, c, metrics.max_batch, offsets, beyond_budget(offsets, metrics.cpu_limit, metrics.cpu_period))
        self.last_model = in_ms({"fixed_ms": a, "per_sample_ms": c, "throttle_ms": offsets})
        for key in ("cpu_share", "cpu_per_wall"):
            self.last_model[key] = [None if x is None else round(float(x), 3) for x in getattr(metrics, key)]
        sizes = split_without(model, (), self.global_batch)
        threshold = float(self.options["deadband"])
        whole = sum(current) == self.global_batch  # (a split of another global batch is never kept)
        may_sit_out = self.sit_out_ok and self.options["sit_out"] > 0 and self.n_ranks > 1
        if may_sit_out:
            at = (update, self.global_batch, threshold, self.sigmas, whole)
            sizes, moved = self.sitouts.decide(model, sizes, current, known, metrics, *at)
            if moved:
                self.last_note = moved
                return sizes
        if notes:
            self.last_note = "; ".join(notes) + ": its old fit is dropped (a typical share until measured)"
            return sizes
        keep = whole and (may_sit_out or min(current) > 0) and _gain(model, current, sizes) <= threshold
        return list(current) if keep else sizes

    def _rose(self, limits: np.ndarray) -> list[int]:
        """Ranks whose CPU limit rose, or stopped binding, since the last rebalance."""
        return [i for i in range(self.n_ranks) if np.isfinite(self.limits[i]) and limits[i] > self.limits[i]]

    def _fit(self, metrics: ClusterMetrics, limits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per rank ``(a, c)`` (:func:`fit_shape`; ranks that report one CPU limit share one ``c``).
        NaN where nothing usable was measured (then ``1 / ops``)."""
        groups: dict = {}
        for i, limit in enumerate(limits):
            groups.setdefault(float(limit) if np.isfinite(limit) else f"rank {i}", []).append(i)
        most = self.global_batch / self.n_ranks
        windows, caps = metrics.compute_samples, metrics.max_batch
        self.shape, c = fit_shape(windows, caps, self.options["window"], most, self.shape, list(groups.values()))
        ops = metrics.ops_array()
        use_ops = np.isnan(c) & np.isfinite(ops) & (ops > 0)  # no steps: its throughput alone
        c[use_ops] = 1.0 / ops[use_ops]
        small = _one_small_size(windows, self.options["window"], groups.values(), most / 2)
        if small.any() and np.isfinite(c[~small]).any():  # until measured at a second size
            c[small] = np.fmax(c[small], np.nanmedian(c[~small]))
        return np.where(use_ops, 0.0, self.shape * c), c

    def _offsets(self, metrics: ClusterMetrics, out) -> np.ndarray:
        """Seconds each rank adds to the update besides its compute: its sync at its CPU limit. A rank
        ``out`` is charged no less than in the last set it was in: the ranks in run a smaller ring
        (REAL, two of four ranks out: 0.87x the sync CPU, median of 13 runs; a set of one runs none),
        which made its return look cheaper than it was."""
        work = least_sync_cpu(metrics.sync_cpu)
        if work is not None:
            self.work_in[~out] = work
        return throttle_offsets(metrics.sync_cpu, metrics.cpu_limit, np.where(out, self.work_in, np.nan))

    def state_dict(self) -> dict:
        limits = [None if np.isnan(v) else ("none" if np.isinf(v) else float(v)) for v in self.limits]
        work_in = [None if np.isnan(v) else float(v) for v in self.work_in]
        state = {"shape": self.shape, "limits": limits, "work_in": work_in, "sitouts": self.sitouts.state_dict()}
        return {**super().state_dict(), **state}

    def load_state_dict(self, state: dict) -> None:
        """Restore; a checkpoint of the old ``balanced`` loads too (its fits are measured again)."""
        super().load_state_dict(state)
        limits = state.get("limits", [None] * self.n_ranks)
        self.limits = np.array([np.nan if v is None else (np.inf if v == "none" else float(v)) for v in limits])
        self.sitouts.load_state_dict(state.get("sitouts", {}))
        work_in = state.get("work_in") or [None] * self.n_ranks
        self.work_in = np.array([np.nan if v is None else float(v) for v in work_in])
        shape = state.get("shape")  # (the old balanced kept one per rank: measured again)
        self.shape = float(shape) if isinstance(shape, (int, float)) else 0.0


def _one_small_size(windows, window: int, groups, most: float) -> np.ndarray:
    """The ranks whose group's steps are all at one size (within 25%, as :func:`fit_shape` tells
    them) of at most ``most`` samples. One size cannot tell a fixed cost from a per-sample one: a
    rank back from sitting out, measured at 1 sample (5.5 ms) beside a fixed cost of 3.49 samples,
    was fitted 1.2 ms per sample against the others' 4.1 and got 21 of 32 samples (2026-12-01); such
    a rank is taken as no faster per sample than the median rank until it is measured at a second size."""
    small = np.zeros(len(windows), dtype=bool)
    for g in groups:
        b = np.array([p[0] for i in g for p in valid_points(windows[i], window)])
        small[g] = b.size > 0 and b.max() < 1.25 * b.min() and b.max() <= most
    return small


def _gain(model, current, sizes) -> float:
    """The fraction of the update ``sizes`` is predicted to save over ``current``."""
    now = predicted_step(model, current)
    return (now - predicted_step(model, sizes)) / now


def _check_number(name: str, value, low: float, high: float, meaning: str) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value < high
    if not ok:
        raise UsageError(f"balanced {name} must be in [{low:g}, {high:g}) ({meaning}), got {value!r}")
