"""Throughput arithmetic over a window of recent steps (pure: no clock, no communication)."""

from __future__ import annotations

from collections import deque


class StepWindow:
    """The last ``size`` (batch_size, compute_seconds) pairs of one rank.

    ``ops()`` is the smoothed compute throughput OPS_i in samples/s: samples over seconds
    summed across the window (a ratio of sums, so long steps weigh more than short ones).
    """

    def __init__(self, size: int = 20):
        if size < 1:
            raise ValueError("window size must be >= 1")
        self._pairs: deque[tuple[int, float]] = deque(maxlen=size)

    def add(self, batch_size: int, seconds: float) -> None:
        if batch_size > 0 and seconds > 0:
            self._pairs.append((int(batch_size), float(seconds)))

    def ops(self) -> float | None:
        """Samples per second over the window, or None before the first step."""
        if not self._pairs:
            return None
        samples = sum(b for b, _ in self._pairs)
        seconds = sum(t for _, t in self._pairs)
        return samples / seconds

    def samples(self) -> list[tuple[int, float]]:
        return list(self._pairs)

    def clear(self) -> None:
        self._pairs.clear()

    def __len__(self) -> int:
        return len(self._pairs)
