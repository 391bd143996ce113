"""Rank 0's outputs: one JSON line per update, run metadata, and a progress bar."""
from __future__ import annotations

import json
import os
import sys
import time


class UpdateLog:
    """Appends one JSON object per update to ``<log_dir>/updates.jsonl`` (line-buffered, so a
    killed run leaves whole lines). ``run.json`` holds the config, world size and emulation."""

    def __init__(self, log_dir: str | None, meta: dict, *, append: bool = False):
        self.log_dir = log_dir
        self._fh = None
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            write_json_atomic(os.path.join(log_dir, "run.json"), meta)
            self._fh = open(os.path.join(log_dir, "updates.jsonl"), "a" if append else "w", buffering=1)

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
