"""Rank 0's outputs: one JSON line per update, run metadata, and a progress bar."""
from __future__ import annotations

import json
import os
import sys
import time

from .errors import UsageError


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

    def write(self, record: dict) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def write_json_atomic(path: str, obj) -> None:
    """Write JSON through a temporary file and a rename: readers never see half a file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


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
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.writelines(kept)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def check_output_paths(log_dir: str | None = None, checkpoint_dir: str | None = None,
                       save_model: str | None = None) -> None:
    """Raise :class:`UsageError` unless each given output location can be created and written.

    Checked before training starts (nothing is created), so a typo costs one line, not a run.
    """
    for flag, directory in (("--log-dir", log_dir), ("--checkpoint-dir", checkpoint_dir),
                            ("--save-model", os.path.dirname(os.path.abspath(save_model)) if save_model else None)):
        if directory:
            _check_writable_dir(directory, flag, save_model if flag == "--save-model" else directory)
    if save_model and os.path.isdir(save_model):
        raise UsageError(f"--save-model {save_model} is a directory; give a file name such as {os.path.join(save_model, 'model.pt')}")


def _check_writable_dir(directory: str, flag: str, shown: str) -> None:
    path = os.path.abspath(os.path.expanduser(directory))
    probe = path
    while not os.path.exists(probe):  # the nearest existing ancestor decides
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UsageError(f"{flag} {shown}: {probe} is a file, not a directory; choose another path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {shown}: {probe} is not writable; choose a directory you can write to")


def read_updates(log_dir: str) -> list[dict]:
    """The per-update records a run wrote (a torn last line is skipped)."""
    out = []
    with open(os.path.join(log_dir, "updates.jsonl")) as fh:
        for line in fh:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


class Progress:
    """A one-line progress bar on stderr: updates, samples/s, current batch sizes.

    On a terminal it redraws in place; otherwise it prints a line every ~10%.
    """

    def __init__(self, total: int, enabled: bool = True, label: str = "train", stream=None):
        self.total = total
        self.enabled = enabled
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._last_pct = -1
        self._t0 = time.perf_counter()
        self._samples = 0

    def update(self, done: int, samples: int, batch_sizes: list[int], loss: float) -> None:
        if not self.enabled:
            return
        self._samples += samples
        rate = self._samples / max(1e-9, time.perf_counter() - self._t0)
        pct = int(100 * done / self.total)
        width = 24
        bar = "#" * (width * done // self.total) + "-" * (width - width * done // self.total)
        line = (f"{self.label} [{bar}] {done}/{self.total} {rate:7.1f} samples/s "
                f"loss {loss:.4f} batch {','.join(map(str, batch_sizes))}")
        if self.tty:
            self.stream.write("\r" + line + (" " * 4) + ("\n" if done == self.total else ""))
            self.stream.flush()
        elif pct // 10 != self._last_pct // 10 or done == self.total:
            self.stream.write(line + "\n")
            self.stream.flush()
        self._last_pct = pct
