"""Rank 0's outputs: one JSON line per update (:class:`UpdateRecord`), run metadata, a progress bar,
and the check that output paths can be written before a run starts."""

from __future__ import annotations

import json
import os
import sys
import time

from .atomic import atomic_write, write_json_atomic
from .errors import UsageError
from .records import UpdateRecord


class UpdateLog:
    """Appends one JSON object per update to ``<log_dir>/updates.jsonl`` (line-buffered, so a
    killed run leaves whole lines). ``run.json`` holds the config, world size and emulation.

    A resumed run passes ``append=True, keep_before=U`` (U = the checkpoint's update): records
    the killed run wrote after its checkpoint, and a torn last line, are dropped first, so the
    file again holds each update exactly once.
    """

    def __init__(self, log_dir: str | None, meta: dict, *, append: bool = False, keep_before: int | None = None):
        self.log_dir = log_dir
        self._fh = None
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            write_json_atomic(os.path.join(log_dir, "run.json"), meta)
            path = os.path.join(log_dir, "updates.jsonl")
            if append and keep_before is not None and os.path.exists(path):
                _truncate_updates(path, keep_before)
            self._fh = open(path, "a" if append else "w", buffering=1)

    def write(self, record: UpdateRecord) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(record.to_dict(), separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _truncate_updates(path: str, keep_before: int) -> None:
    """Rewrite ``path`` (atomically) with only the whole records of updates < ``keep_before``."""
    kept = []
    with open(path) as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("update"), int) and record["update"] < keep_before:
                kept.append(json.dumps(record, separators=(",", ":")) + "\n")
    atomic_write(path, lambda fh: fh.writelines(kept))


def check_output_paths(
    log_dir: str | None = None,
    checkpoint_dir: str | None = None,
    save_model: str | None = None,
    tensorboard: str | None = None,
) -> None:
    """Raise :class:`UsageError` unless each given output location can be created and written.

    Checked before training starts (nothing is created), so a typo costs one line, not a run.
    """
    for flag, directory in (
        ("--log-dir", log_dir),
        ("--checkpoint-dir", checkpoint_dir),
        ("--save-model", os.path.dirname(os.path.abspath(save_model)) if save_model else None),
        ("--tensorboard", tensorboard),
    ):
        if directory:
            _check_writable_dir(directory, flag, save_model if flag == "--save-model" else directory)
    if save_model and os.path.isdir(save_model):
        raise UsageError(
            f"--save-model {save_model} is a directory; give a file name such as {os.path.join(save_model, 'model.pt')}"
        )


def _check_writable_dir(directory: str, flag: str, shown: str) -> None:
    path = os.path.abspath(os.path.expanduser(directory))
    probe = path
    while not os.path.exists(probe):  # the nearest existing ancestor decides
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UsageError(f"{flag} {shown}: {probe} is a file, not a directory; choose another path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {shown}: {probe} is not writable; choose a directory you can write to")


def read_updates(log_dir: str) -> list[UpdateRecord]:
    """The per-update records a run wrote (a torn or foreign line is skipped)."""
    out = []
    with open(os.path.join(log_dir, "updates.jsonl")) as fh:
        for line in fh:
            try:
                out.append(UpdateRecord.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError, AttributeError):
                continue
    return out


class Progress:
    """Rank 0's progress: a tqdm bar on a terminal; elsewhere (a log file, mpirun's pipes) the
    same text as a line every ~10% of the run. Shows updates, samples/s, loss and batch sizes."""

    def __init__(self, total: int, enabled: bool = True, label: str = "train", stream=None, start: int = 0):
        self.total, self.enabled, self.label = total, enabled, label
        self.stream = stream or sys.stderr
        self.start = start
        self._t0 = time.perf_counter()
        self._samples = 0
        self._last_tenth = -1
        self._bar = None
        if enabled and _isatty(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, initial=start, desc=label, unit="update", file=self.stream, dynamic_ncols=True, leave=True
            )

    def update(self, record) -> None:
        """After an update: ``record`` is its :class:`UpdateRecord`."""
        if not self.enabled:
            return
        self._samples += record.global_batch
        done = record.update + 1
        rate = self._samples / max(1e-9, time.perf_counter() - self._t0)
        info = f"{rate:.1f} samples/s, loss {record.loss:.4f}, batch {','.join(map(str, record.batch_sizes))}"
        if self._bar is not None:
            self._bar.set_postfix_str(info, refresh=False)
            self._bar.update(done - self._bar.n)
            return
        tenth = 10 * done // self.total
        if tenth != self._last_tenth or done == self.total:
            from tqdm import tqdm

            meter = tqdm.format_meter(
                done,
                self.total,
                time.perf_counter() - self._t0,
                ncols=60,
                ascii=True,
                prefix=self.label,
                unit="update",
                initial=self.start,
            )
            self.stream.write(f"{meter} {info}\n")
            self.stream.flush()
            self._last_tenth = tenth

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
