"""One update as one rank sees it (what :meth:`bno_hvd.library.balancer.Balancer.start_step` gives),
and the Balancer's options for samples of their own lengths (:class:`TextOptions`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bno_hvd.allocation.microbatch import token_parts, token_shares

__all__ = ["Step", "TextOptions"]


@dataclass(frozen=True, eq=False)
class TextOptions:
    """What a :class:`~bno_hvd.Balancer` needs for samples of their own lengths (token sequences).

    Args:
        lengths: one length per sample (the tokens of a sequence): each rank's loss weight is then
            its share of the global batch's tokens (:class:`~bno_hvd.Step`).
        max_tokens: this rank's cap in padded tokens per forward/backward pass.
        work: one cost per sample (``bno_hvd.allocation.costmodel``): measured steps are then
            fitted in work.
        cost: the ``SequenceCost`` that ``work`` came from (checkpoints keep it).
        emulated_work: what an EMULATED device takes time for.
        shares: the strategy's sizes are each rank's share of the work of a global batch of
            ``global_count`` samples or ``global_tokens`` tokens (``bno_hvd.allocation.partition``).
        global_count: with ``shares``: the sequences of a global batch.
        global_tokens: with ``shares``: the tokens of a global batch.

    Example::

        text = bno.TextOptions(lengths=seqs.lengths)       # weights by tokens, not sequences
        strategy = bno.make_strategy("balanced", hvd.size(), 16)
        bal = bno.Balancer(MPI.COMM_WORLD.Dup(), strategy, len(seqs), text=text)
    """

    lengths: Any = None
    max_tokens: int | None = None
    work: Any = None
    cost: Any = None
    emulated_work: Any = None
    shares: bool = False
    global_count: int | None = None
    global_tokens: int | None = None


@dataclass
class Step:
    """One update as one rank sees it: what :meth:`~bno_hvd.Balancer.start_step` returns (and
    ``Balancer.current_step`` holds while the update runs). Its fields: ``update``, ``batch_sizes``
    (every rank's batch), ``weight`` (n_rank / sum(n), or this rank's share of the tokens: multiply
    the mean loss by it and allreduce with Sum), ``size`` (this rank's batch), ``indices`` (without
    a loader), ``cap`` (samples per pass under a memory cap), ``keys`` ((epoch, index) of each
    sample) and, for text, ``lengths`` and ``global_tokens``.

    Example::

        step = bal.start_step(batch)                       # a loop of your own (Balancer's example)
        x, y = batch.data
        (F.cross_entropy(model(x), y) * step.weight).backward()
        step.update, step.batch_sizes, step.size           # e.g. 40, [40, 39, 39, 10], 10 on rank 3
    """

    update: int
    batch_sizes: list[int]  # every rank's batch this update
    weight: float  # n_rank / sum(n): multiply the mean loss by it, allreduce with Sum
    size: int  # this rank's batch
    indices: np.ndarray | None = None  # without a loader: this rank's sample indices
    cap: int | None = None  # this rank's memory cap: samples per forward/backward pass
    keys: tuple = ()  # with a loader: (epoch, index) of every sample of this rank's batch
    # samples of their own lengths (a Balancer made with TextOptions(lengths=...)): this rank's, in batch order
    lengths: np.ndarray | None = None
    global_tokens: int | None = None  # the lengths' sum over the global batch
    token_cap: int | None = None  # memory cap in padded tokens per pass (--max-tokens)
    shares: list[int] | None = None  # allocated by work: every rank's share (batch_sizes: its sequences)
    work: int | None = None  # this rank's work (costmodel.UNITS per average sequence), with shares or work
    emulated_work: float | None = None  # what an EMULATED device takes time for (the measured cost), if given
    rows: slice | None = None  # the micro-batch being computed (set while parts() yields it): exact dropout's keys

    @property
    def micro_batches(self) -> int:
        """Forward/backward passes this rank's batch takes under its memory cap."""
        if self.lengths is not None:
            return len(token_parts(self.lengths, self.token_cap))
        return 1 if self.cap is None else -(-self.size // self.cap)

    @property
    def tokens(self) -> int | None:
        """This rank's tokens (the lengths' sum), None without lengths."""
        return None if self.lengths is None else int(self.lengths.sum())

    def parts(self):
        """``(slice, share)`` per micro-batch: the samples of one pass, and their share of the
        batch (of its samples; of its tokens when the samples have lengths)."""
        if self.lengths is not None:
            parts = token_parts(self.lengths, self.token_cap)
            pairs = [
                (slice(start, stop), share) for (start, stop), share in zip(parts, token_shares(self.lengths, parts))
            ]
        else:
            per = self.size if self.cap is None else self.cap
            pairs = [
                (slice(a, min(self.size, a + per)), (min(self.size, a + per) - a) / self.size)
                for a in range(0, self.size, per)
            ]
        for rows, share in pairs:
            self.rows = rows
            yield rows, share
        self.rows = None

    @property
    def batch_size(self) -> int:
        return self.size

    @property
    def global_batch(self) -> int:
        return int(sum(self.batch_sizes))
