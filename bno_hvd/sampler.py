"""Uneven, allocation-independent sampling.

Contract: the order of samples depends only on ``seed`` and the epoch. Each epoch is one
global permutation of the dataset; the permutations of consecutive epochs form one stream,
consumed in consecutive *global* batches of size ``sum(batch_sizes)``. Rank ``r`` takes the
slice that starts at ``sum(batch_sizes[:r])``. Hence:

- every sample is used exactly once per epoch, whatever the allocation does between steps
  (a global batch that crosses an epoch boundary takes the rest of this epoch's permutation
  and the start of the next one);
- the global batch of a step does not depend on how many ranks share it.

The sampler's position (``epoch``, ``offset``) is part of the training state (checkpoints).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def epoch_permutation(dataset_len: int, seed: int, epoch: int) -> np.ndarray:
    """The global order of epoch ``epoch``: a permutation of ``range(dataset_len)``."""
    rng = np.random.default_rng([int(seed), int(epoch)])
    return rng.permutation(dataset_len)


def rank_slice(batch_sizes: list[int], rank: int) -> tuple[int, int]:
    """``(start, stop)`` of ``rank``'s part inside a global batch."""
    start = int(sum(batch_sizes[:rank]))
    return start, start + int(batch_sizes[rank])


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

    def __post_init__(self) -> None:
        if self.dataset_len <= 0:
            raise ValueError("UnevenSampler needs a non-empty dataset")
        self._perm_cache: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perm_cache:
            # keep only the epochs still needed: a step never spans more than a few epochs
            for old in [e for e in self._perm_cache if e < self.epoch]:
                del self._perm_cache[old]
            self._perm_cache[epoch] = epoch_permutation(self.dataset_len, self.seed, epoch)
        return self._perm_cache[epoch]

    def global_batch(self, total: int) -> np.ndarray:
        """The next ``total`` indices of the stream, without advancing."""
        out = np.empty(total, dtype=np.int64)
        filled, epoch, offset = 0, self.epoch, self.offset
        while filled < total:
            take = min(total - filled, self.dataset_len - offset)
            out[filled:filled + take] = self._perm(epoch)[offset:offset + take]
            filled += take
            offset += take
            if offset == self.dataset_len:
                epoch, offset = epoch + 1, 0
        return out

    def advance(self, total: int) -> None:
        """Move past ``total`` samples of the stream (every rank does this, in step)."""
        pos = self.offset + int(total)
        self.epoch += pos // self.dataset_len
        self.offset = pos % self.dataset_len

    def next_indices(self, batch_sizes: list[int], rank: int) -> np.ndarray:
        """Indices of ``rank``'s batch for this step, then advance by ``sum(batch_sizes)``."""
        if any(int(b) < 1 for b in batch_sizes):
            raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
        total = int(sum(batch_sizes))
        start, stop = rank_slice(batch_sizes, rank)
        idx = self.global_batch(total)[start:stop]
        assert len(idx) == batch_sizes[rank], "a rank's slice must have its allocated length"
        self.advance(total)
        return idx

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "offset": self.offset,
                "dataset_len": self.dataset_len}

    def load_state_dict(self, state: dict) -> None:
        if int(state["dataset_len"]) != self.dataset_len:
            raise ValueError("checkpoint was made with a dataset of a different size")
        self.seed, self.epoch, self.offset = int(state["seed"]), int(state["epoch"]), int(state["offset"])
