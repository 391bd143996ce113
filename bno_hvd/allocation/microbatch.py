"""Micro-batches of sequences under a memory cap in tokens (pure).

A rank whose batch holds more padded tokens than its cap (``--max-tokens``) processes it in
consecutive micro-batches and accumulates the gradients, as ``--max-batch`` does for samples. A
micro-batch of sequences is padded to its longest, so its memory follows ``count x longest``;
the rank's sequences arrive shortest first (:class:`~bno_hvd.allocation.sampler.UnevenSampler`),
and each micro-batch takes as many as fit. Each micro-batch's loss is weighted by its share of the
rank's tokens, so the accumulated gradient is the rank's mean over all its tokens.

Usage::

    token_parts([3, 5, 8, 8, 20], cap=24)   # [(0, 3), (3, 4), (4, 5)]: 3 x 8, 1 x 8, 1 x 20 tokens
"""

from __future__ import annotations


def token_parts(lengths, cap: int | None) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive micro-batches of ``lengths`` whose padded tokens
    (count x longest) stay within ``cap`` (None: one part). A sequence longer than the cap is a
    part of its own (the configuration check refuses caps below ``--max-seq-len``)."""
    lengths = [int(n) for n in lengths]
    if cap is None or not lengths:
        return [(0, len(lengths))]
    parts, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        widest = max(longest, n)
        if i > start and (i - start + 1) * widest > cap:
            parts.append((start, i))
            start, widest = i, n
        longest = widest
    parts.append((start, len(lengths)))
    return parts


def token_shares(lengths, parts) -> list[float]:
    """Each part's share of the tokens in ``lengths`` (they sum to 1)."""
    total = sum(int(n) for n in lengths)
    return [sum(int(n) for n in lengths[a:b]) / total for a, b in parts]
