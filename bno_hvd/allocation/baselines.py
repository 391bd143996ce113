"""Baseline policies we compare against. All keep the global batch fixed.

* ``equal``        every rank gets B, always (plain Horovod).
* ``random``       the BNO paper's random distribution: a fresh random split of the global batch
                   at every rebalance, reproducible from ``(seed, update)``.
* ``fixed``        the user's ``batch_sizes``, always.
* ``proportional`` Chao et al.: a static split proportional to the throughput (ops) of the first
                   usable measurement, frozen from then on.
* ``paramhub``     ParamHub-style one-shot rebalance: the first rebalance call at an update index
                   >= ``paramhub_after`` (default 1, i.e. after warm-up iterations have run)
                   splits proportional to throughput, then the split is frozen. It differs from
                   ``proportional`` only in *when* it measures: ``proportional`` trusts the very
                   first measurement it gets, ``paramhub`` waits out ``paramhub_after`` updates.
* ``lbbsp``        LB-BSP: at every rebalance predict each rank's speed by exponential smoothing
                   of its throughput (``alpha`` = weight of the newest sample, default 0.5) and
                   split proportional to the prediction; no deadband.

Memory caps (``metrics.max_batch``) do not bound any split: a rank processes a share above its cap
in micro-batches with gradient accumulation. Only ``balanced`` models what an extra micro-batch costs.
"""

from __future__ import annotations

import numbers

import numpy as np

from bno_hvd.allocation.metrics import ClusterMetrics
from bno_hvd.allocation.strategy import Strategy
from bno_hvd.common.arguments import describe
from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import BATCH


class EqualStrategy(Strategy):
    """Every rank gets the base batch size B, always. ``even``: every rank gets an equal share of
    ``global_batch`` instead (sizes differ by at most one), whatever the number of ranks; what
    ``--elastic`` uses, whose global batch stays while ranks leave and join."""

    name = "equal"
    OPTIONS = {"even": False}

    def __init__(self, n_ranks, base_batch_size, *, global_batch=None, seed=0, **options):
        super().__init__(n_ranks, base_batch_size, global_batch=global_batch, seed=seed, **options)
        if not self.options["even"] and self.global_batch != self.n_ranks * self.base_batch_size:
            raise UsageError(
                f"'equal' gives every rank --base-batch-size {base_batch_size}, so the global batch "
                f"is {self.n_ranks * self.base_batch_size}; drop --global-batch or use 'balanced'"
            )

    def initial(self) -> list[int]:
        return super().initial() if self.options["even"] else [self.base_batch_size] * self.n_ranks

    def rebalance(self, metrics: ClusterMetrics, current: list[int], update: int) -> list[int]:
        self._begin(metrics, current)
        return self.initial()


class RandomStrategy(Strategy):
    """A uniformly random split (Dirichlet(1,...,1) shares) of the global batch, each rank >= 1."""

    name = "random"

    def initial(self) -> list[int]:
        return self._random_split(0, None)

    def rebalance(self, metrics: ClusterMetrics, current: list[int], update: int) -> list[int]:
        self._begin(metrics, current)
        return self._random_split(update, metrics)

    def _random_split(self, update: int, metrics: ClusterMetrics | None) -> list[int]:
        # Seeding from (seed, update) makes a resumed run draw the same splits without state.
        rng = np.random.default_rng([self.seed, int(update)])
        return self._split(rng.dirichlet(np.ones(self.n_ranks)), metrics)


class FixedStrategy(Strategy):
    """The user's per-rank ``batch_sizes``, never changed."""

    name = "fixed"

    def __init__(self, n_ranks, base_batch_size, *, batch_sizes=None, global_batch=None, seed=0, **options):
        super().__init__(n_ranks, base_batch_size, seed=seed, **options)
        if not isinstance(batch_sizes, (list, tuple)) or len(batch_sizes) != n_ranks:
            got = f"{len(batch_sizes)}" if isinstance(batch_sizes, (list, tuple)) else describe(batch_sizes)
            got = "none" if batch_sizes is None else got
            raise UsageError(f"'fixed' needs --batch-sizes with one size per rank ({n_ranks}), got {got}")
        integral = all(isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in batch_sizes)
        # 0 sits a rank out (not rank 0), where the loop or a drop-in can: the Balancer checks that
        if not integral or not all(0 <= b <= BATCH.high for b in batch_sizes) or batch_sizes[0] < 1:
            shown = ", ".join(describe(b) for b in batch_sizes[:8]) + (", ..." if len(batch_sizes) > 8 else "")
            raise UsageError(
                f"--batch-sizes must all be integers >= 0 and rank 0's >= 1 (at most {BATCH.high:g}), got [{shown}]"
            )
        self.batch_sizes = [int(b) for b in batch_sizes]
        if global_batch is not None and global_batch != sum(self.batch_sizes):
            raise UsageError(
                f"--global-batch {global_batch} disagrees with sum(--batch-sizes) = "
                f"{sum(self.batch_sizes)}; drop --global-batch"
            )
        self.global_batch = sum(self.batch_sizes)

    def initial(self) -> list[int]:
        return list(self.batch_sizes)

    def rebalance(self, metrics: ClusterMetrics, current: list[int], update: int) -> list[int]:
        self._begin(metrics, current)
        return list(self.batch_sizes)


class ProportionalStrategy(Strategy):
    """Chao et al.: split proportional to the first usable throughput measurement, then freeze."""

    name = "proportional"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.frozen: list[int] | None = None

    def rebalance(self, metrics: ClusterMetrics, current: list[int], update: int) -> list[int]:
        self._begin(metrics, current)
        if self.frozen is None and self._ready(update):
            ops = metrics.ops_array()
            if np.isfinite(ops).all() and (ops > 0).all():
                self.frozen = self._split(ops, metrics)
            else:
                self._warn(
                    f"{self.name}: throughput missing for rank(s) "
                    f"{np.flatnonzero(~(ops > 0)).tolist()}; kept the current allocation"
                )
        return list(self.frozen) if self.frozen is not None else list(current)

    def _ready(self, update: int) -> bool:
        return True

    def state_dict(self) -> dict:
        return {**super().state_dict(), "frozen": self.frozen}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.frozen = None if state.get("frozen") is None else [int(b) for b in state["frozen"]]


class ParamHubStrategy(ProportionalStrategy):
    """ParamHub-style: one rebalance at the first call with ``update >= paramhub_after``, then fixed."""

    name = "paramhub"
    OPTIONS = {"paramhub_after": 1}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        after = self.options["paramhub_after"]
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise UsageError(f"paramhub_after must be an integer >= 0, got {after!r}")

    def _ready(self, update: int) -> bool:
        return update >= self.options["paramhub_after"]


class LBBSPStrategy(Strategy):
    """LB-BSP: split proportional to exponentially smoothed throughput, every rebalance."""

    name = "lbbsp"
    OPTIONS = {"alpha": 0.5}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        alpha = self.options["alpha"]
        if not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
            raise UsageError(f"lbbsp alpha must be in (0, 1] (weight of the newest throughput), got {alpha!r}")
        self.predicted = np.full(self.n_ranks, np.nan)

    def rebalance(self, metrics: ClusterMetrics, current: list[int], update: int) -> list[int]:
        self._begin(metrics, current)
        ops = metrics.ops_array()
        seen = np.isfinite(ops) & (ops > 0)
        alpha = float(self.options["alpha"])
        first = seen & np.isnan(self.predicted)
        later = seen & ~np.isnan(self.predicted)
        self.predicted[first] = ops[first]
        self.predicted[later] = alpha * ops[later] + (1 - alpha) * self.predicted[later]
        known = ~np.isnan(self.predicted)
        if not known.any():
            self._warn("lbbsp: no rank has reported a throughput yet; kept the current allocation")
            return list(current)
        if not seen.all():
            self._warn(
                f"lbbsp: throughput missing for rank(s) {np.flatnonzero(~seen).tolist()}; using their last prediction"
            )
        # A rank never measured is assumed average rather than starved or flooded.
        speed = np.where(known, self.predicted, self.predicted[known].mean())
        return self._split(speed, metrics)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "predicted": [None if np.isnan(x) else float(x) for x in self.predicted]}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.predicted = np.array([np.nan if x is None else float(x) for x in state["predicted"]])
