"""The training clock: wall seconds that can be paused (evaluation is not training).

Usage::

    clock = Stopwatch()
    cycle = clock.lap()             # seconds since the previous lap (pauses left out)
    with clock.paused():
        evaluate()                  # not counted in elapsed() or the next lap()
    clock.stop(); ...; clock.go()   # the same, around another run's block (bench --rounds)
    clock.elapsed()                 # training seconds since the start
"""

from __future__ import annotations

import time
from contextlib import contextmanager


class Stopwatch:
    def __init__(self, now=time.perf_counter):
        self._now = now
        self._start = self._last = now()
        self._paused = 0.0  # paused seconds so far
        self._paused_at_lap = 0.0  # paused seconds at the previous lap
        self._stopped_at = None  # when stop() was called (None: running)

    def elapsed(self) -> float:
        """Training seconds since the start."""
        return self._now() - self._start - self._paused

    def lap(self) -> float:
        """Training seconds since the previous ``lap()`` (or the start)."""
        now = self._now()
        seconds = now - self._last - (self._paused - self._paused_at_lap)
        self._last, self._paused_at_lap = now, self._paused
        return seconds

    def stop(self) -> None:
        """Stop counting until :meth:`go` (another run trains in between)."""
        if self._stopped_at is None:
            self._stopped_at = self._now()

    def go(self) -> None:
        if self._stopped_at is not None:
            self._paused += self._now() - self._stopped_at
            self._stopped_at = None

    @contextmanager
    def paused(self):
        t0 = self._now()
        try:
            yield
        finally:
            self._paused += self._now() - t0
