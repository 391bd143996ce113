"""Each rank's slice of the global batch, through a real ``torch.utils.data.DataLoader``.

``Balancer.loader(dataset, num_workers=2, prefetch_factor=2, pin_memory=True, ...)`` builds a
DataLoader with the user's loading options and three parts of ours:

- :class:`UnevenBatchSampler` (runs in the loader's main process, ``num_workers x
  prefetch_factor`` batches ahead of training): the batch of update t is this rank's slice of
  the global batch that starts where the stream stands after updates ``0..t-1``, with the sizes
  the :class:`~bno_hvd.allocation.plan.AllocationPlan` holds for t. Its position counts *used* batches
  (the balancer's finished updates), never fetched ones: an ``iter()`` (a new epoch, a re-created
  loader, a resumed run) starts at the next update to run. One ``iter()`` is one epoch: the
  updates whose global batch starts in the current epoch of the stream (a global batch that
  crosses the epoch's end belongs to the epoch it starts in).
- :class:`KeyedDataset`: samples addressed by (update, epoch, index). With ``seed_samples`` the
  random generators (torch's CPU generator, random, numpy) are seeded from (seed, epoch, index)
  before a sample is read, so a random augmentation depends on the sample and its epoch only: not
  on the rank that reads it, the allocation, the worker, or whether the run was resumed. Only the
  generators that reading the first batch moved are seeded from then on (a dataset that draws no
  random numbers costs nothing: seeding all three cost 3% of the DDP example's step); a dataset
  whose first batch draws nothing but a later sample does is not covered.
- :class:`Batch`: what the loop receives: the update it belongs to, its size, the user's
  collated data (or the one-line reason it could not be read), and each sample's (epoch, index)
  key (what :func:`bno_hvd.library.dropout.exact_dropout` seeds its masks from).

The lag agreement: every rank's prefetch depth P is gathered, and allocations take effect
``D = max P + 1`` updates after they are decided (:mod:`bno_hvd.allocation.plan`).

What a loader needs from the balancer is one small :class:`LoaderFeed`: the plan of
allocations, the sample stream, the rank, and the (collective) lag agreement.
"""

from __future__ import annotations

import inspect
import random
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate
from torch.utils.data._utils.pin_memory import pin_memory as _pin

from bno_hvd.allocation.sampler import updates_left
from bno_hvd.common.arguments import (
    check_callable,
    check_flag,
    check_int,
    check_keys,
    check_number,
    check_optional_int,
    describe,
    first_line,
)
from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import show_path

EMPTY = -1  # the sample index of the one key of an empty batch (a rank that sits an update out)

# DataLoader arguments that decide batching and order: those belong to the balancer.
OWNED = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")


@dataclass(frozen=True)
class LoaderFeed:
    """What a loader reads of its balancer: nothing else couples the two."""

    plan: Any  # bno_hvd.allocation.plan.AllocationPlan: every rank's batch of every decided update
    sampler: Any  # bno_hvd.allocation.sampler.UnevenSampler: where the stream of samples stands
    rank: int
    agree_lag: Callable[[int], int]  # collective: the lag for loaders that read this deep ahead


@dataclass
class Batch:
    """One rank's batch of one update, as :meth:`~bno_hvd.Balancer.loader` delivers it: ``update``,
    ``size`` (its samples), ``data`` (what ``collate_fn`` made of them), ``keys`` ((epoch, index)
    of each sample, in order); ``error`` instead of data where a sample could not be read, which
    ``start_step`` raises. (:class:`~bno_hvd.DataLoader` yields ``data`` alone.)

    Example::

        for batch in bal.batches(bal.loader(data, num_workers=2), updates=100):
            step = bal.start_step(batch)          # checks the batch against the plan
            x, y = batch.data
    """

    update: int
    size: int
    data: Any = None  # the collated samples (what collate_fn made)
    error: str | None = None  # set instead of data when a sample could not be read
    notes: tuple = ()  # one line per warning raised while reading (the balancer's warning channel)
    keys: tuple = ()  # (epoch, index) of every sample, in the batch's order

    def pin_memory(self, device=None) -> Batch:  # called by the DataLoader's pin-memory thread
        data = None if self.data is None else _pin(self.data)
        return Batch(self.update, self.size, data, self.error, self.notes, self.keys)


def prefetch_depth(num_workers: int, prefetch_factor: int | None) -> int:
    """Batches a DataLoader draws ahead of the one the loop is using."""
    return 0 if num_workers == 0 else num_workers * (2 if prefetch_factor is None else prefetch_factor)


class UnevenBatchSampler:
    """Keys ``(update, epoch, index)`` of this rank's batch per update; see the module doc."""

    def __init__(self, plan, sampler, rank: int):
        self.plan, self.sampler, self.rank = plan, sampler, rank

    def __iter__(self):
        update, position = self.plan.done, self.sampler.position
        epoch = position.epoch
        while position.epoch == epoch:
            sizes = self.plan.sizes(update)  # LagError if not decided yet: never a mismatch
            idx, epochs = self.sampler.slice_at(position, sizes, self.rank)
            # a rank that sits this update out: one key that says so (a DataLoader fetches nothing
            # for an empty list of keys, and the loop still needs the update's Batch)
            yield [(update, e, i) for e, i in zip(epochs.tolist(), idx.tolist())] or [(update, EMPTY, EMPTY)]
            position = position.advanced(self.sampler.batch_count(position, sizes), self.sampler.dataset_len)
            update += 1

    def __len__(self) -> int:
        """Updates left in this epoch at the newest global batch (exact while it does not change)."""
        total = self.sampler.batch_count(self.sampler.position, self.plan.latest())
        return updates_left(self.sampler.dataset_len, self.sampler.offset, total)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed per (seed, epoch, sample) (splitmix64 finaliser: nearby inputs, unrelated seeds)."""
    z = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return (z ^ (z >> 31)) >> 1


# The random generators a sample's reading may draw from: (seed it, its state, set its state). torch's
# CPU generator alone: torch.manual_seed also queues a seed for every GPU backend, recording a stack
# trace each time (0.2-1.4 ms a sample, more than reading it).
GENERATORS = {
    "torch": (lambda s: torch.default_generator.manual_seed(s), torch.get_rng_state, torch.set_rng_state),
    "random": (random.seed, random.getstate, random.setstate),
    "numpy": (lambda s: np.random.seed(s % 2**32), np.random.get_state, np.random.set_state),
}


def _same(a, b) -> bool:
    """Two states of one generator are equal (torch: a tensor; numpy: a tuple holding an array)."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, tuple) and any(isinstance(x, np.ndarray) for x in a):
        return all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(a, b))
    return a == b


class KeyedDataset(Dataset):
    """``dataset`` addressed by ``(update, epoch, index)`` keys; a whole batch per call."""

    def __init__(self, dataset, seed: int, seed_samples: bool, fast_tensors: bool):
        self.dataset, self.seed, self.seed_samples = dataset, int(seed), seed_samples
        self.fast_tensors = fast_tensors and isinstance(dataset, TensorDataset)
        self.drawn_from = None if seed_samples else ()  # the generators reading a sample draws from (probed)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        return self.__getitems__([key])

    def __getitems__(self, keys) -> _Fetched:
        update = keys[0][0]
        if keys[0][2] == EMPTY:
            return _Fetched(update, 0, collated=(), keys=())
        sample_keys = tuple((int(e), int(i)) for _, e, i in keys)
        try:
            if self.fast_tensors:  # an in-memory dataset: one gather per tensor, no per-sample calls
                idx = torch.as_tensor([k[2] for k in keys])
                return _Fetched(
                    update, len(keys), collated=tuple(t[idx] for t in self.dataset.tensors), keys=sample_keys
                )
            # A decoder's warning (PIL: "Corrupt EXIF data") would reach stderr as two lines per
            # sample on every rank: it goes to the balancer's warning channel instead, as one line.
            with warnings_as_notes() as caught:
                samples = self._read(keys)
            return _Fetched(update, len(keys), samples=samples, notes=self._notes(caught), keys=sample_keys)
        except Exception as err:  # noqa: BLE001 - reported as one line by the rank that reads it
            return _Fetched(update, len(keys), error=self._describe(err))

    def _notes(self, caught) -> tuple:
        seen = {f"{w.category.__name__}: {' '.join(str(w.message).split())[:200]}" for w in caught}
        return tuple(f"reading {type(self.dataset).__name__} samples: {note}" for note in sorted(seen))

    def _read(self, keys) -> list:
        probing = self.seed_samples and self.drawn_from is None
        names = list(GENERATORS) if probing else list(self.drawn_from or ())
        if not names:  # nothing to seed: a dataset that draws no random numbers
            return [self._get(index) for _, _, index in keys]
        in_worker = get_worker_info() is not None
        saved = None if in_worker else {n: GENERATORS[n][1]() for n in names}
        moved = set()
        try:
            out = []
            for _, epoch, index in keys:
                s = sample_seed(self.seed, epoch, index)
                for name in names:
                    GENERATORS[name][0](s)
                seeded = {n: GENERATORS[n][1]() for n in names} if probing else None
                out.append(self._get(index))
                if probing:
                    moved.update(n for n in names if not _same(seeded[n], GENERATORS[n][1]()))
            if probing:  # the generators this dataset's first batch drew from: the only ones seeded from now on
                self.drawn_from = tuple(n for n in names if n in moved)
            return out
        finally:
            if saved is not None:  # the training process's own generators are left as they were
                for name, state in saved.items():
                    GENERATORS[name][2](state)

    def _get(self, index):
        self._current = index
        return self.dataset[index]

    def _describe(self, err: Exception) -> str:
        index = getattr(self, "_current", None)
        where = f"sample {index}" if index is not None else "a sample"
        files = getattr(self.dataset, "samples", None)
        if index is not None and isinstance(files, list) and index < len(files):
            where += f" ({show_path(files[index][0])})"
        detail = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        return (
            f"cannot read {where} of {type(self.dataset).__name__}: {type(err).__name__}"
            + (f": {detail}" if detail else "")
            + "; fix or remove that sample"
        )


@contextmanager
def warnings_as_notes():
    """Collect the warnings shown meanwhile instead of printing them. It swaps ``showwarning``
    and leaves the filters alone: ``warnings.catch_warnings`` resets every module's record of
    the warnings it has shown, and a training loop's once-per-place warnings (a model's
    ``log_softmax`` without ``dim``) then came back with every batch."""
    caught, shown = [], warnings.showwarning

    def keep(message, category, filename, lineno, file=None, line=None):
        caught.append(warnings.WarningMessage(message, category, filename, lineno, file, line))

    warnings.showwarning = keep
    try:
        yield caught
    finally:
        warnings.showwarning = shown


@dataclass
class _Fetched:
    update: int
    size: int
    samples: list | None = None
    collated: Any = None
    error: str | None = None
    notes: tuple = ()
    keys: tuple = ()


class CollateToBatch:
    """Wraps the user's ``collate_fn``: one :class:`Batch` per fetched batch."""

    def __init__(self, collate_fn=None):
        self.collate_fn = collate_fn or default_collate

    def __call__(self, fetched: _Fetched) -> Batch:
        if fetched.error is not None:
            return Batch(fetched.update, fetched.size, error=fetched.error)
        if fetched.size == 0:
            return Batch(fetched.update, 0, None)
        if fetched.collated is not None:
            return Batch(fetched.update, fetched.size, fetched.collated, keys=fetched.keys)
        try:
            data = self.collate_fn(fetched.samples)
            return Batch(fetched.update, fetched.size, data, notes=fetched.notes, keys=fetched.keys)
        except Exception as err:  # noqa: BLE001
            return Batch(
                fetched.update,
                fetched.size,
                error=f"collate_fn failed on update {fetched.update}'s batch: {type(err).__name__}: {str(err)[:200]}",
            )


def make_loader(feed: LoaderFeed, dataset, *, seed_samples: bool = True, **kwargs) -> DataLoader:
    """The DataLoader behind :meth:`bno_hvd.library.balancer.Balancer.loader` (collective: agrees the lag)."""
    owned = [k for k in OWNED if k in kwargs]
    if owned:
        raise UsageError(
            f"loader() got {', '.join(owned)}: batching and sample order belong to the balancer; "
            "pass only loading options (num_workers, prefetch_factor, pin_memory, ...)"
        )
    if kwargs.get("in_order") is False:
        raise UsageError(
            "in_order=False lets batches overtake each other; the balancer needs them in update order, so drop in_order"
        )
    check_loader_options(kwargs, seed_samples)
    workers = kwargs.get("num_workers", 0)
    factor = kwargs.get("prefetch_factor")
    if workers == 0 and factor is not None:
        kwargs.pop("prefetch_factor")  # torch refuses it without workers; it means nothing there
    if workers == 0:
        kwargs.pop("persistent_workers", None)
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise UsageError(f"loader() needs a map-style dataset (__getitem__ and __len__), got {type(dataset).__name__}")
    feed.agree_lag(prefetch_depth(workers, factor))
    keyed = KeyedDataset(dataset, feed.sampler.seed, seed_samples, fast_tensors=kwargs.get("collate_fn") is None)
    collate = CollateToBatch(kwargs.pop("collate_fn", None))
    try:
        return DataLoader(
            keyed,
            batch_sampler=UnevenBatchSampler(feed.plan, feed.sampler, feed.rank),
            collate_fn=collate,
            **kwargs,
        )
    except (TypeError, ValueError) as err:  # torch's own checks of the loading options
        raise UsageError(f"torch's DataLoader refused the loading options: {first_line(err)}") from None


def check_loader_options(options: dict, seed_samples) -> None:
    """The loading options a user passes on to torch's DataLoader, checked before torch sees them
    (some fail only in a worker, at the first batch)."""
    check_keys("the loader", options, LOADING_OPTIONS)
    check_int("num_workers", options.get("num_workers", 0), 0, 1024)
    check_optional_int("prefetch_factor", options.get("prefetch_factor"), 1, 1024)
    if check_number("timeout", options.get("timeout", 0), 0, 10**6) and not options.get("num_workers"):
        raise UsageError("timeout= waits for worker processes: give num_workers > 0 too, or drop timeout")
    for name in ("collate_fn", "worker_init_fn"):
        check_callable(name, options.get(name))
    for name, default in (("pin_memory", False), ("persistent_workers", False), ("in_order", True)):
        check_flag(name, options.get(name, default))
    check_flag("seed_samples", seed_samples)
    generator = options.get("generator")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise UsageError(f"generator must be a torch.Generator or None, got {describe(generator)}")


LOADING_OPTIONS = [p for p in inspect.signature(DataLoader).parameters if p not in ("dataset", *OWNED)]
