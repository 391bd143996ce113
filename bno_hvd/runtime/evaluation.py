"""Test accuracy, every rank scoring its own shard of the test split (then one Horovod sum).

Usage::

    correct, total = evaluate(hvd, model, test_set, rank, size, batch_size=1000, device=device)
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Subset, TensorDataset


def shard_indices(n: int, rank: int, size: int, batch_size: int) -> list[int]:
    """Rank ``rank``'s part of ``range(n)``: blocks of ``batch_size``, dealt round-robin."""
    return [
        i for start in range(rank * batch_size, n, size * batch_size) for i in range(start, min(start + batch_size, n))
    ]


def evaluate(
    hvd, model, dataset, rank: int, size: int, batch_size: int, *, device=None, num_workers: int = 0
) -> tuple[int, int]:
    """Correct predictions and total over ``dataset`` (collective over Horovod's ranks)."""
    dtype = next(model.parameters()).dtype
    device = device or next(model.parameters()).device
    shard = shard_indices(len(dataset), rank, size, batch_size)
    correct = torch.zeros(1, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for x, y in _batches(dataset, shard, batch_size, num_workers):
            logits = model(x.to(device=device, dtype=dtype, non_blocking=True))
            correct += (logits.argmax(1).cpu() == y).sum()
    model.train()
    correct = hvd.allreduce(correct, op=hvd.Sum, name="bno.eval.correct")
    return int(correct.item()), len(dataset)


def _batches(dataset, shard: list[int], batch_size: int, num_workers: int):
    if isinstance(dataset, TensorDataset):  # in memory: slices, no loader
        x, y = dataset.tensors
        for k in range(0, len(shard), batch_size):
            idx = torch.as_tensor(shard[k : k + batch_size])
            yield x[idx], y[idx]
        return
    yield from DataLoader(Subset(dataset, shard), batch_size=batch_size, num_workers=num_workers)
