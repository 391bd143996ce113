"""The :class:`Strategy` interface every rebalancing policy implements.

A strategy is pure: it never talks to MPI and never reads a clock; every number arrives in a
:class:`~bno_hvd.allocation.metrics.ClusterMetrics`. Rank 0 calls ``rebalance`` every K updates
and broadcasts the result.

Warnings: when a strategy cannot use this round's metrics it keeps ``current`` and sets
``last_warning`` (reset to None at the start of every ``rebalance``): part of the result of that
call, which the control plane passes on to the one warning channel (:class:`bno_hvd.common.errors.WarningLog`).
"""

from __future__ import annotations

import numbers
from typing import Any

from bno_hvd.allocation.metrics import ClusterMetrics
from bno_hvd.allocation.rounding import round_to_total
from bno_hvd.common.errors import UsageError, check_invariant
from bno_hvd.common.parsing import BATCH, RANKS, SEED, show_value


class Strategy:
    """Base: a rebalancing policy. Pure: no MPI/clock; all numbers come in through ClusterMetrics.

    Subclasses set ``name``, list their keyword options with defaults in ``OPTIONS`` and
    implement ``rebalance``. Unknown options raise :class:`UsageError`.

    Args:
        n_ranks: the number of ranks N.
        base_batch_size: the per-rank base batch B.
        global_batch: the samples of one update, split over the ranks (None: N*B).
        seed: for strategies that draw (``random``).
        **options: the strategy's own, named in ``OPTIONS`` (e.g. ``deadband`` of ``balanced``).

    Example (a strategy of your own, given to a Balancer in place of a name)::

        class ByThroughput(bno.Strategy):
            name = "by-throughput"

            def rebalance(self, metrics, current, update):
                self._begin(metrics, current)          # checks the sizes, clears the last notes
                ops = metrics.ops_array()              # samples/s per rank, NaN: not measured
                return self._split(ops) if np.isfinite(ops).all() else list(current)

        strategy = ByThroughput(n_ranks=4, base_batch_size=32)
        strategy.initial()                             # [32, 32, 32, 32]
    """

    name: str = "base"
    OPTIONS: dict[str, Any] = {}
    sit_out_ok = False  # the loop lets a rank but 0 sit an update out (0 samples); set by the Balancer

    def __init__(
        self, n_ranks: int, base_batch_size: int, *, global_batch: int | None = None, seed: int = 0, **options
    ):
        check_sizes(n_ranks, base_batch_size, global_batch, seed)
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            valid = ", ".join(sorted(self.OPTIONS)) or "none"
            raise UsageError(f"strategy '{self.name}' has no option {unknown[0]!r}; valid options: {valid}")
        self.n_ranks = int(n_ranks)
        self.base_batch_size = int(base_batch_size)
        self.global_batch = int(global_batch) if global_batch is not None else self.n_ranks * self.base_batch_size
        self.seed = int(seed)
        self.options = {**self.OPTIONS, **options}
        self.last_warning: str | None = None
        self.last_note: str | None = None  # why this rebalance moved, when it is not the fit's split (a probe)
        self.last_model: dict | None = None  # per rank, what the split came from (balanced: fits and offsets, ms)

    @property
    def changes_global_batch(self) -> bool:
        """True when the global batch may differ from ``global_batch`` (only ``bno``)."""
        return False

    def initial(self) -> list[int]:
        """Allocation before any measurement: the global batch split as evenly as possible."""
        return round_to_total([1.0] * self.n_ranks, self.global_batch)

    def rebalance(self, metrics: ClusterMetrics, current: list[int], update: int) -> list[int]:
        """New per-rank batch sizes (N ints >= 1). ``update`` is the index of the next update."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """JSON-serialisable state for checkpoints (subclasses extend it)."""
        return {"strategy": self.name, "n_ranks": self.n_ranks}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict`; a checkpoint of another strategy/size is refused."""
        if state.get("strategy") != self.name or state.get("n_ranks") != self.n_ranks:
            raise UsageError(
                f"checkpoint holds strategy {show_value(state.get('strategy'))} for "
                f"{show_value(state.get('n_ranks'))} ranks, but this run uses '{self.name}' on "
                f"{self.n_ranks}; resume with the same --strategy and process count"
            )

    # -- helpers for subclasses -------------------------------------------------------------

    def _begin(self, metrics: ClusterMetrics, current: list[int]) -> None:
        """Reset ``last_warning`` and check sizes; call first in every ``rebalance``."""
        self.last_warning = None
        self.last_note = None
        self.last_model = None
        if metrics.n != self.n_ranks:
            raise UsageError(f"metrics describe {metrics.n} ranks but the strategy has {self.n_ranks}")
        if not valid_sizes(current, self.n_ranks, self.sit_out_ok):
            low = "0 (rank 0: 1)" if self.sit_out_ok else "1"
            raise UsageError(f"current allocation {list(current)} must be {self.n_ranks} ints >= {low}")

    def _warn(self, message: str) -> None:
        self.last_warning = message

    def _split(self, weights, metrics: ClusterMetrics | None = None) -> list[int]:
        """The fixed global batch split proportional to ``weights`` (a share above a rank's memory
        cap is processed in micro-batches, so caps do not bound the split)."""
        sizes = round_to_total(weights, self.global_batch, 1)
        check_invariant(sum(sizes) == self.global_batch, f"{self.name} split {sum(sizes)}, not {self.global_batch}")
        return sizes


def valid_sizes(sizes, n_ranks: int, sit_out_ok: bool = False) -> bool:
    """``n_ranks`` batch sizes of at least 1; with ``sit_out_ok`` any ranks but 0 may have 0 (ranks
    that sit out leave the allreduce to the process set of the others)."""
    sizes = [int(b) for b in sizes]
    if len(sizes) != n_ranks or sizes[0] < 1 or any(b < 0 for b in sizes):
        return False
    return sit_out_ok or 0 not in sizes


def check_sizes(n_ranks, base_batch_size, global_batch=None, seed=0) -> None:
    """The arguments every strategy takes (``make_strategy`` checks them before it picks one)."""
    _check_int("number of ranks", n_ranks, 1, maximum=RANKS.high)
    _check_int("base batch size (--base-batch-size)", base_batch_size, 1, maximum=BATCH.high)
    if global_batch is not None:
        _check_int(
            "global batch (--global-batch)",
            global_batch,
            n_ranks,
            hint=f"each of the {n_ranks} ranks needs at least one sample",
            maximum=n_ranks * BATCH.high,
        )
    _check_int("seed (--seed)", seed, 0, maximum=SEED.high)


def _check_int(what: str, value, minimum: int, hint: str = "", maximum: int | None = None) -> None:
    """``value`` is an int in ``[minimum, maximum]``: a batch of 2**63 would overflow numpy's int64."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        extra = f" ({hint})" if hint else ""
        raise UsageError(f"{what} must be an integer >= {minimum}, got {show_value(value)}{extra}")
    if maximum is not None and value > maximum:
        raise UsageError(f"{what} must be at most {maximum}, got {show_value(value)}")
