"""Rank 0's outputs: one JSON line per update (:class:`UpdateRecord`), run metadata, a progress bar,
and the check that output paths can be written before a run starts."""

from __future__ import annotations

import json
import os
import sys
import time

from bno_hvd.common.atomic import atomic_write, write_json_atomic
from bno_hvd.common.errors import UsageError
from bno_hvd.training.results import UpdateRecord


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


PROGRESS_ENV = "BNO_HVD_PROGRESS"  # "events": rank 0 writes progress events for `bno-hvd console`
PROGRESS_EVENT = "bno-hvd-progress "  # an event line: this prefix, then one JSON object


class Progress:
    """Rank 0's progress: updates, samples/s, loss and batch sizes, shown by a :class:`ProgressDisplay`.

    Under ``bno-hvd console`` (``BNO_HVD_PROGRESS=events`` in the environment, which horovodrun
    hands to every rank) no rank has a terminal: rank 0 then writes progress *events*, one line
    each (``bno-hvd-progress {json}``, at most ~10 a second), and the console draws the bar."""

    def __init__(
        self, total: int, enabled: bool = True, label: str = "train", stream=None, start: int = 0, environ=os.environ
    ):
        self.total, self.enabled, self.label = total, enabled, label
        self.stream = stream or sys.stderr
        self.start = start
        self.events = enabled and environ.get(PROGRESS_ENV) == "events"
        self._t0 = time.perf_counter()
        self._samples = self._tokens = 0
        self._last_event = -1.0
        self._display = None
        if self.events:
            self._emit({"event": "start", "label": label, "total": total, "initial": start})
        elif enabled:
            self._display = ProgressDisplay(total, label, self.stream, start)

    def update(self, record) -> None:
        """After an update: ``record`` is its :class:`UpdateRecord`."""
        if not self.enabled:
            return
        self._samples += record.global_batch
        self._tokens += record.global_tokens or 0
        done = record.update + 1
        elapsed = max(1e-9, time.perf_counter() - self._t0)
        tokens = f", {self._tokens / elapsed:.0f} tokens/s" if self._tokens else ""  # text
        info = (
            f"{self._samples / elapsed:.1f} samples/s{tokens}, loss {record.loss:.4f}, "
            f"batch {','.join(map(str, record.batch_sizes))}"
        )
        if self._display is not None:
            self._display.show(done, info)
        elif time.perf_counter() - self._last_event >= 0.1 or done >= self.total:
            self._emit({"event": "update", "n": done, "info": info})
            self._last_event = time.perf_counter()

    def close(self) -> None:
        if self._display is not None:
            self._display.close()
            self._display = None
        if self.events:
            self._emit({"event": "close"})
            self.events = False

    def _emit(self, event: dict) -> None:
        self.stream.write(PROGRESS_EVENT + json.dumps(event, separators=(",", ":")) + "\n")  # one write: one line
        self.stream.flush()


# tqdm's default without its updates/s (samples/s follows, in the postfix): room for the bar
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"


class ProgressDisplay:
    """A tqdm bar when ``stream`` is a terminal; elsewhere (a log file, a pipe) the same text as
    a line every ~10% of the run and at its end. Used by :class:`Progress` and by the console."""

    def __init__(self, total: int, label: str, stream, start: int = 0):
        self.total, self.label, self.stream, self.start = total, label, stream, start
        self._t0 = time.perf_counter()
        self._last_tenth = -1
        self._bar = None
        if _isatty(stream):
            from tqdm import tqdm

            sized = min(_terminal_size(stream)) > 0  # a terminal without a size (some pseudo-terminals): 100 x 24
            self._bar = tqdm(
                total=total,
                initial=start,
                desc=label,
                unit="update",
                file=stream,
                dynamic_ncols=sized,
                ncols=None if sized else 100,
                nrows=None if sized else 24,  # tqdm hides bars below the last row, and 0 rows hides every bar
                leave=True,
                bar_format=BAR_FORMAT,
            )

    @property
    def bar(self):
        """The tqdm bar on a terminal (None elsewhere)."""
        return self._bar

    def show(self, done: int, info: str) -> None:
        """``done`` updates of ``total`` are finished; ``info`` follows the meter."""
        if self._bar is not None:
            self._bar.set_postfix_str(info, refresh=False)
            self._bar.update(done - self._bar.n)
            if done >= self.total:  # finished: the bar stays above what the run prints next
                self.close()
            return
        tenth = 10 * done // max(1, self.total)
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


def _terminal_size(stream) -> tuple[int, int]:
    try:
        return tuple(os.get_terminal_size(stream.fileno()))
    except (AttributeError, ValueError, OSError):
        return (0, 0)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
