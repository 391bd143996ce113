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


def evaluate_text(hvd, model, dataset, rank: int, size: int, batch_tokens: int) -> tuple[float, int]:
    """Summed next-token loss (nats) and the number of predicted tokens over ``dataset`` (token
    sequences, :mod:`bno_hvd.data.tokens`), every rank scoring every ``size``-th sequence in
    batches of at most ``batch_tokens`` padded tokens (collective over Horovod's ranks)."""
    import numpy as np

    from bno_hvd.data.tokens import IGNORE, collate_tokens, inputs_and_targets

    device = next(model.parameters()).device
    mine = np.arange(rank, len(dataset), size)
    mine = mine[np.argsort(dataset.lengths[mine], kind="stable")]  # similar lengths pad little
    totals = torch.zeros(2, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        start = 0
        while start < len(mine):
            stop = start + 1
            while stop < len(mine) and (stop - start + 1) * int(dataset.lengths[mine[stop]]) <= batch_tokens:
                stop += 1
            tokens, lengths = collate_tokens([dataset[int(i)] for i in mine[start:stop]])
            inputs, targets = inputs_and_targets(tokens, lengths)
            logits = model(inputs.to(device), lengths.to(device))
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                targets.to(device).reshape(-1),
                ignore_index=IGNORE,
                reduction="sum",
            )
            totals += torch.tensor([float(loss), float(lengths.sum())], dtype=torch.float64)
            start = stop
    model.train()
    totals = hvd.allreduce(totals, op=hvd.Sum, name="bno.eval.text")
    return float(totals[0]), int(totals[1])
