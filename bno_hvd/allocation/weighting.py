"""Sample-weighted gradient averaging, as pure arithmetic.

Each rank computes the mean loss over its ``n_r`` samples. Scaling it by ``n_r / sum_j n_j``
and summing the gradients over ranks (Horovod allreduce, ``op=Sum``) gives exactly the mean
gradient over the whole global batch - the update one process would compute on it.
(Horovod's ``prescale_factor`` must be equal on every rank, so the weight goes into the loss, or
into each rank's gradient before the allreduce: :mod:`bno_hvd.library.dropin`.)
"""

from __future__ import annotations

from bno_hvd.common.arguments import describe
from bno_hvd.common.errors import UsageError


def sample_weights(batch_sizes: list[int]) -> list[float]:
    """``n_r / sum(n)`` for every rank; they sum to 1."""
    total = sum(int(b) for b in batch_sizes)
    if total <= 0 or any(int(b) < 0 for b in batch_sizes):
        raise ValueError(f"batch sizes must be non-negative with a positive sum, got {batch_sizes}")
    return [int(b) / total for b in batch_sizes]


def rank_weight(batch_sizes: list[int], rank: int) -> float:
    """The factor rank ``rank`` multiplies its mean loss by before the ``Sum`` allreduce."""
    return sample_weights(batch_sizes)[rank]


def scaled_lr(base_lr: float, global_batch: int, n_ranks: int, base_batch_size: int, rule: str = "linear") -> float:
    """Learning rate for a global batch that differs from ``n_ranks * base_batch_size``.

    ``linear``: lr * global / (N * B) (Goyal et al.'s linear scaling rule); ``none``: lr.
    """
    if rule == "none":
        return base_lr
    if rule == "linear":
        return base_lr * global_batch / (n_ranks * base_batch_size)
    raise UsageError(f"unknown lr scaling rule {describe(rule)}; use 'linear' or 'none'")


def keeps_batches_even(strategy_name: str, initial: list[int]) -> bool:
    """True when a strategy can never give two ranks different batches (``equal``; ``fixed`` with one size)."""
    return strategy_name in ("equal", "fixed") and len({int(b) for b in initial}) == 1


def gradient_reduction(op: str, even: bool, predivide: float = 1.0) -> tuple[str, bool]:
    """What the drop-in ``DistributedOptimizer`` asks Horovod for, given the user's ``op``:
    ``(horovod_op, weighted)``. Refuses, with one line, what cannot be exact.

    - ``average``: the mean gradient over the global batch (each rank's mean-loss gradient
      times n_r / sum(n), then summed); with even batches that is Horovod's Average;
    - ``sum``: the gradients summed unweighted, exact for losses that sum over samples;
    - ``adasum``: Horovod's Adasum, only where batches are always even (it combines ranks
      non-linearly, so no per-rank weight makes uneven batches exact)."""
    if predivide != 1.0:
        raise UsageError(
            f"gradient_predivide_factor={predivide:g}: the sample-weighted mean is a sum of weighted "
            "gradients and Horovod allows a predivide factor only with op=Average; drop it"
        )
    if op == "average":
        return "sum", True
    if op == "sum":
        return "sum", False
    if op == "adasum":
        if not even:
            raise UsageError(
                "op=hvd.Adasum cannot give the sample-weighted mean of uneven batches; use op=hvd.Average, "
                "or the strategy 'equal' (even batches) with Adasum"
            )
        return "adasum", False
    raise UsageError(f"op={op}: the balancer's optimizer takes op=hvd.Average, hvd.Sum or hvd.Adasum")
