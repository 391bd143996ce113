"""``bno``: the BalanceNet Orchestrator policy, eq. (5) of the paper applied at every rebalance.

The global batch follows the formula and is *not* held fixed (``changes_global_batch`` is True;
the trainer scales the learning rate by ``global / (N * B)``). Two run-time rules sit on top of
the pure formula in :mod:`.paper`:

* if any rank's ops, memory or latency row is missing or non-finite, keep ``current`` and set
  ``last_warning`` (the formula would otherwise read a missing OPS as 0 and starve that rank);
* memory caps (``max_batch``) do not change eq. (5): a share above a rank's cap is processed in
  micro-batches with gradient accumulation, so it cannot run out of memory.
"""

from __future__ import annotations

import numpy as np

from bno_hvd.allocation.metrics import ClusterMetrics, usable_ranks
from bno_hvd.allocation.paper import bno_batch_sizes
from bno_hvd.allocation.strategy import Strategy
from bno_hvd.common.errors import UsageError


class BNOStrategy(Strategy):
    """Paper policy: ``initial() == [B] * N``; ``rebalance`` applies eqs. (1)-(5)."""

    name = "bno"

    def __init__(self, n_ranks, base_batch_size, *, global_batch=None, seed=0, **options):
        super().__init__(n_ranks, base_batch_size, seed=seed, **options)
        if global_batch is not None and global_batch != self.global_batch:
            raise UsageError(
                "'bno' derives its global batch from eq. (5) and --base-batch-size; "
                "drop --global-batch or use 'balanced' for a fixed global batch"
            )

    @property
    def changes_global_batch(self) -> bool:
        return True

    def initial(self) -> list[int]:
        return [self.base_batch_size] * self.n_ranks

    def rebalance(self, metrics: ClusterMetrics, current: list[int], update: int) -> list[int]:
        self._begin(metrics, current)
        ok = usable_ranks(metrics)
        if not ok.all():
            self._warn(
                f"bno: metrics missing or non-finite for rank(s) {np.flatnonzero(~ok).tolist()}; "
                "kept the current allocation"
            )
            return list(current)
        sizes = bno_batch_sizes(metrics.ops_array(), metrics.memory_used, metrics.latency_array(), self.base_batch_size)
        return sizes
