"""Uneven, allocation-independent sampling (pure index arithmetic).

Contract: the order of samples depends only on ``seed`` and the epoch. Each epoch is one
global permutation of the dataset; the permutations of consecutive epochs form one stream,
consumed in consecutive *global* batches of size ``sum(batch_sizes)``. Rank ``r`` takes the
slice that starts at ``sum(batch_sizes[:r])``. Hence:

- every sample is used exactly once per epoch, whatever the allocation does between steps
  (a global batch that crosses an epoch boundary takes the rest of this epoch's permutation
  and the start of the next one);
- the global batch of a step does not depend on how many ranks share it.

The sampler's position (``epoch``, ``offset``) is where the next update to run starts; it is
part of the training state (checkpoints). A DataLoader reads ahead of it with :meth:`slice_at`
(see :mod:`bno_hvd.library.loader`); only finished updates move it (:meth:`advance`).

Samples of their own lengths (token sequences): with ``lengths`` (one number per sample, e.g.
its tokens), a rank's slice is the same set of samples, ordered by length (shortest first,
stream order among equals), so that consecutive micro-batches pad little; :meth:`tokens_at`
gives the lengths' sum over a global batch and a rank's slice (the loss weights of
:mod:`bno_hvd.allocation.weighting`).

Shares of work (``work``: one number per sample, :mod:`bno_hvd.allocation.costmodel`): the batch
sizes are then each rank's *share* of the update's work, and the global batch is fixed apart from
them: ``global_count`` samples, or (``global_tokens``) the fewest next samples whose lengths sum
to at least that many tokens. It is sorted by work and cut by the shares
(:func:`~bno_hvd.allocation.partition.split_by_shares`); :meth:`counts_at` gives every rank's
number of samples and :meth:`batch_count` how far the stream moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bno_hvd.allocation.partition import rank_range, split_by_shares
from bno_hvd.common.errors import UsageError, check_invariant


def epoch_permutation(dataset_len: int, seed: int, epoch: int) -> np.ndarray:
    """The global order of epoch ``epoch``: a permutation of ``range(dataset_len)``."""
    rng = np.random.default_rng([int(seed), int(epoch)])
    return rng.permutation(dataset_len)


def rank_slice(batch_sizes: list[int], rank: int) -> tuple[int, int]:
    """``(start, stop)`` of ``rank``'s part inside a global batch."""
    start = int(sum(batch_sizes[:rank]))
    return start, start + int(batch_sizes[rank])


def updates_left(dataset_len: int, offset: int, global_batch: int) -> int:
    """Global batches that start in an epoch from ``offset`` on (the last one may cross its end)."""
    return -(-(int(dataset_len) - int(offset)) // int(global_batch))


def epoch_share(dataset_len: int, batch_sizes: list[int], rank: int) -> int:
    """Samples ``rank`` reads in an epoch at this allocation: ceil(dataset_len * n_r / sum(n))."""
    return -(-int(dataset_len) * int(batch_sizes[rank]) // int(sum(batch_sizes)))


@dataclass(frozen=True)
class Position:
    """A place in the stream: ``offset`` samples into epoch ``epoch``."""

    epoch: int
    offset: int

    def advanced(self, samples: int, dataset_len: int) -> Position:
        pos = self.offset + int(samples)
        return Position(self.epoch + pos // dataset_len, pos % dataset_len)


@dataclass
class UnevenSampler:
    """Yields each rank's indices for one step of an uneven allocation.

    Usage::

        sampler = UnevenSampler(len(dataset), seed=0)
        idx = sampler.next_indices(batch_sizes, rank)   # advances by sum(batch_sizes)
    """

    dataset_len: int
    seed: int = 0
    epoch: int = 0
    offset: int = 0
    lengths: np.ndarray | None = field(default=None, repr=False, compare=False)  # per sample, or None
    work: np.ndarray | None = field(default=None, repr=False, compare=False)  # per sample: sizes are shares
    global_count: int | None = None  # with work: samples per global batch ...
    global_tokens: int | None = None  # ... or the fewest whose lengths reach this

    def __post_init__(self) -> None:
        if self.dataset_len <= 0:
            raise UsageError(f"the sample stream needs a dataset of at least one sample, got {self.dataset_len}")
        self._perm_cache: dict[int, np.ndarray] = {}

    @property
    def position(self) -> Position:
        return Position(self.epoch, self.offset)

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perm_cache:
            # keep only the epochs still needed: a look-ahead never spans more than a few epochs
            for old in [e for e in self._perm_cache if e < self.epoch]:
                del self._perm_cache[old]
            self._perm_cache[epoch] = epoch_permutation(self.dataset_len, self.seed, epoch)
        return self._perm_cache[epoch]

    def take(self, start: Position, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``count`` indices of the stream from ``start``, and the epoch each one belongs to."""
        out = np.empty(count, dtype=np.int64)
        epochs = np.empty(count, dtype=np.int64)
        filled, epoch, offset = 0, start.epoch, start.offset
        while filled < count:
            take = min(count - filled, self.dataset_len - offset)
            out[filled : filled + take] = self._perm(epoch)[offset : offset + take]
            epochs[filled : filled + take] = epoch
            filled += take
            offset += take
            if offset == self.dataset_len:
                epoch, offset = epoch + 1, 0
        return out, epochs

    def global_batch(self, total: int) -> np.ndarray:
        """The next ``total`` indices of the stream, without advancing."""
        return self.take(self.position, total)[0]

    def slice_at(self, start: Position, batch_sizes: list[int], rank: int) -> tuple[np.ndarray, np.ndarray]:
        """``rank``'s indices (and their epochs) in the global batch that starts at ``start``."""
        if any(int(b) < 0 for b in batch_sizes) or sum(int(b) for b in batch_sizes) < 1:
            raise ValueError(f"batch sizes must be >= 0 with a positive sum, got {list(batch_sizes)}")
        if self.work is not None:
            idx, epochs = self._sorted_batch(start, batch_sizes)
            lo, hi = rank_range(split_by_shares(self.work[idx], batch_sizes), batch_sizes, rank)
            idx, epochs = idx[lo:hi], epochs[lo:hi]
            order = np.argsort(self.lengths[idx], kind="stable")
            return idx[order], epochs[order]
        lo, hi = rank_slice(batch_sizes, rank)
        idx, epochs = self.take(start.advanced(lo, self.dataset_len), hi - lo)
        check_invariant(len(idx) == batch_sizes[rank], "a rank's slice must have its allocated length")
        if self.lengths is not None:
            order = np.argsort(self.lengths[idx], kind="stable")
            idx, epochs = idx[order], epochs[order]
        return idx, epochs

    def _sorted_batch(self, start: Position, shares: list[int]) -> tuple[np.ndarray, np.ndarray]:
        idx, epochs = self.take(start, self.batch_count(start, shares))
        order = np.argsort(self.work[idx], kind="stable")
        return idx[order], epochs[order]

    def batch_count(self, start: Position, batch_sizes: list[int]) -> int:
        """Samples in the global batch at ``start``: ``sum(batch_sizes)``; with ``work``, by count or tokens."""
        if self.work is None:
            return int(sum(batch_sizes))
        if self.global_tokens is None:
            return int(self.global_count)
        need, chunk = len(batch_sizes), 64
        while True:
            idx, _ = self.take(start, chunk)
            reached = np.flatnonzero(np.cumsum(self.lengths[idx]) >= self.global_tokens)
            if reached.size:
                return max(need, int(reached[0]) + 1)
            chunk *= 2

    def counts_at(self, start: Position, batch_sizes: list[int]) -> list[int]:
        """Every rank's number of samples in the global batch at ``start``."""
        if self.work is None:
            return [int(b) for b in batch_sizes]
        idx, _ = self._sorted_batch(start, batch_sizes)
        return split_by_shares(self.work[idx], batch_sizes)

    def tokens_at(self, start: Position, batch_sizes: list[int], rank: int) -> tuple[int, int]:
        """With ``lengths``: their sum over the global batch at ``start`` and over ``rank``'s slice."""
        if self.lengths is None:
            raise UsageError("tokens_at() needs a sampler made with lengths= (one per sample)")
        total = int(self.lengths[self.take(start, self.batch_count(start, batch_sizes))[0]].sum())
        mine = int(self.lengths[self.slice_at(start, batch_sizes, rank)[0]].sum())
        return total, mine

    def advance(self, total: int) -> None:
        """Move past ``total`` samples of the stream (every rank does this, in step)."""
        pos = self.position.advanced(total, self.dataset_len)
        self.epoch, self.offset = pos.epoch, pos.offset

    def next_indices(self, batch_sizes: list[int], rank: int) -> np.ndarray:
        """Indices of ``rank``'s batch for this step, then advance by ``sum(batch_sizes)``."""
        idx, _ = self.slice_at(self.position, batch_sizes, rank)
        self.advance(int(sum(batch_sizes)))
        return idx

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "offset": self.offset, "dataset_len": self.dataset_len}

    def load_state_dict(self, state: dict) -> None:
        if int(state["dataset_len"]) != self.dataset_len:
            raise UsageError(
                f"the saved stream is of a dataset of {state['dataset_len']} samples, this one has {self.dataset_len}"
            )
        self.seed, self.epoch, self.offset = int(state["seed"]), int(state["epoch"]), int(state["offset"])
        self._perm_cache.clear()
