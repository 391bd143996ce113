"""The sample ledger: which part of the sample stream every committed update used.

Each update of ``bno-hvd train`` takes the next global batch of one sample stream
(:mod:`bno_hvd.allocation.sampler`): a contiguous run of stream positions, ``[start, stop)`` of an
epoch's permutation (two runs when it crosses an epoch's end). The ledger records those runs per
update, so it costs a few numbers an update, whatever the batch. Rank 0 appends one JSON line per
update to ``<log_dir>/ledger.jsonl`` and fsyncs it (the line is on disk before the next update
starts); every rank keeps the entries in memory, checkpoints hold them, and a resumed (or, with
``--elastic``, a re-formed) run rewrites the file, atomically, with the entries of the state it
continues from, so the file always describes the parameters that exist.

:func:`check_entries` (``bno-hvd ledger check DIR``) proves from the file alone that each sample of
each epoch was used exactly once: a position used twice or skipped is named with its sample.

Usage (the loop builds it; a hook of every run)::

    ledger = Ledger(log_dir, dataset_len=60000, seed=0)   # rank 0 writes; others pass log_dir=None
"""

from __future__ import annotations

import json
import os
import time

from bno_hvd.allocation.sampler import Position, epoch_permutation
from bno_hvd.common.atomic import atomic_write
from bno_hvd.common.errors import UsageError
from bno_hvd.training.hooks import Hook

FILE = "ledger.jsonl"


def stream_ranges(start: Position, samples: int, dataset_len: int) -> list[list[int]]:
    """``[[epoch, start, stop], ...]``: the stream positions of ``samples`` samples from ``start``."""
    out, epoch, offset, left = [], start.epoch, start.offset, int(samples)
    while left > 0:
        take = min(left, dataset_len - offset)
        out.append([epoch, offset, offset + take])
        left -= take
        epoch, offset = (epoch + 1, 0) if offset + take == dataset_len else (epoch, offset + take)
    return out


class Ledger(Hook):
    """Records each update's stream ranges after it is committed (a hook of every run).

    ``members``: the worker ids of the ranks, recorded with each update (``--elastic``)."""

    def __init__(self, log_dir: str | None, *, dataset_len: int, seed: int, members=None):
        self.path = os.path.join(log_dir, FILE) if log_dir else None
        self.header = {"ledger": 1, "dataset_len": int(dataset_len), "seed": int(seed)}
        self.entries: list[dict] = []
        self.members = None if members is None else list(members)
        self.balancer = None
        self.pending: dict | None = None  # the update in flight: its entry, once it is committed
        self.resumed: list[dict] | None = None  # the entries of a restored state (checkpoint, or a re-formed job)
        self._fh = None

    def start(self, run) -> None:
        self.balancer = run.balancer

    def open(self, entries: list[dict] | None = None, resumed_from: int | None = None) -> Ledger:
        """Start the file with ``entries`` (a resumed state's), atomically; a run resumed from a
        checkpoint without entries keeps the file's entries before ``resumed_from``."""
        if entries is None and resumed_from is not None and self.path and os.path.isfile(self.path):
            entries = [e for e in read_ledger(os.path.dirname(self.path))[1] if e["update"] < resumed_from]
        self.entries = [dict(e) for e in entries or []]
        if self.path:
            lines = [self.header, *self.entries]
            text = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in lines)
            atomic_write(self.path, lambda fh: fh.write(text))
            self._fh = open(self.path, "a")
        return self

    def before_compute(self, step) -> None:
        bal = self.balancer
        entry = {"update": int(step.update), "ranges": None, "sizes": [int(b) for b in step.batch_sizes]}
        if self.members is not None:
            entry["members"] = self.members
        self.pending = {"entry": entry, "start": bal.sampler.position, "samples": int(step.global_batch)}

    def after_update(self, record, stats) -> None:
        self.commit()

    def commit(self) -> None:
        """The update in flight is committed (its optimizer step taken): record it."""
        if self.pending is None:
            return
        entry, start, samples = self.pending["entry"], self.pending["start"], self.pending["samples"]
        self.pending = None
        entry["ranges"] = stream_ranges(start, samples, self.header["dataset_len"])
        entry["at"] = round(time.time(), 3)  # wall clock of the commit (recovery times: docs/elastic.md)
        self.entries.append(entry)
        if self._fh is not None:
            self._fh.write(json.dumps(entry, separators=(",", ":")) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def committed_entries(directory: str) -> list[dict]:
    """The entries of a ledger that may still be written (a running job's), in file order: none
    when there is no file yet, and not the last line while it is being written."""
    path = os.path.join(directory, FILE)
    if not os.path.exists(path):
        return []
    entries = []
    with open(path, encoding="utf-8") as fh:
        for line in fh.read().splitlines()[1:]:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                break  # the line being written
    return entries


def read_ledger(directory: str) -> tuple[dict, list[dict]]:
    """The header and entries of ``<directory>/ledger.jsonl``; :class:`UsageError` when missing or damaged."""
    path = os.path.join(directory, FILE)
    if not os.path.isfile(path):
        raise UsageError(f"no {FILE} in {directory}: give the --log-dir of a bno-hvd train run")
    header, entries = None, []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                raise UsageError(f"{path} line {number} is not JSON (a torn or edited ledger)") from None
            if header is None:
                header = item
            else:
                entries.append(item)
    if not isinstance(header, dict) or header.get("ledger") != 1:
        raise UsageError(f"{path} does not start with a bno-hvd ledger header")
    return header, entries


def check_entries(header: dict, entries: list[dict]) -> str:
    """The summary line when every sample of every epoch was used exactly once (the last epoch: a
    prefix of its permutation); :class:`LedgerError` naming the first sample lost or repeated."""
    n, seed = int(header["dataset_len"]), int(header["seed"])
    by_epoch: dict[int, list[tuple[int, int, int]]] = {}
    for entry in entries:
        for epoch, lo, hi in entry["ranges"]:
            by_epoch.setdefault(int(epoch), []).append((int(lo), int(hi), int(entry["update"])))
    epochs = sorted(by_epoch)
    if epochs and epochs != list(range(epochs[0], epochs[-1] + 1)):
        missing = next(e for e in range(epochs[0], epochs[-1]) if e not in by_epoch)
        raise LedgerError(_lost(missing, 0, n, seed))
    for epoch in epochs:
        _check_epoch(epoch, sorted(by_epoch[epoch]), n, seed, last=epoch == epochs[-1])
    changes = sum(1 for a, b in zip(entries, entries[1:]) if a.get("members") != b.get("members"))
    samples = sum(hi - lo for e in entries for _, lo, hi in e["ranges"])
    whole = len(epochs) - 1 if epochs else 0
    tail = (by_epoch[epochs[-1]] and max(hi for _, hi, _ in by_epoch[epochs[-1]])) if epochs else 0
    return (
        f"ledger ok: {len(entries)} updates used {samples} samples, each exactly once: {whole} whole epoch(s) "
        f"and {tail} of {n} samples of the next; {changes} membership change(s)"
    )


class LedgerError(UsageError):
    """A sample was lost or used twice (``bno-hvd ledger check`` exits 1)."""

    exit_code = 1


def _check_epoch(epoch: int, spans: list, n: int, seed: int, *, last: bool) -> None:
    reach, reached_by = 0, None
    for lo, hi, update in spans:
        if lo < reach:
            raise LedgerError(
                f"ledger: sample {_sample(n, seed, epoch, lo)} repeated: update {update} used stream position "
                f"{lo} of epoch {epoch}, already used by update {reached_by}"
            )
        if lo > reach:
            raise LedgerError(_lost(epoch, reach, n, seed))
        reach, reached_by = hi, update
    if reach < n and not last:
        raise LedgerError(_lost(epoch, reach, n, seed))


def _sample(n: int, seed: int, epoch: int, position: int) -> int:
    return int(epoch_permutation(n, seed, epoch)[position])


def _lost(epoch: int, position: int, n: int, seed: int) -> str:
    return (
        f"ledger: sample {_sample(n, seed, epoch, position)} lost: no update used stream position "
        f"{position} of epoch {epoch}"
    )
