"""Sample-weighted gradient averaging, as pure arithmetic.

Each rank computes the mean loss over its ``n_r`` samples. Scaling it by ``n_r / sum_j n_j``
and summing the gradients over ranks (Horovod allreduce, ``op=Sum``) gives exactly the mean
gradient over the whole global batch - the update one process would compute on it.
(Horovod's ``prescale_factor`` must be equal on every rank, so the weight goes into the loss.)
"""

from __future__ import annotations


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
    raise ValueError(f"unknown lr scaling rule {rule!r}; use 'linear' or 'none'")
