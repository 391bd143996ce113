"""Heterogeneity *emulation*: make rank i behave like a device of relative speed f_i.

Rank i really computes its batch; its compute phase is then stretched to last
``b_i / (f_i * R)`` seconds (R: samples/s of a speed-1 device). Stretching measured compute
time instead would not work here: ranks share cores, so measured time depends on what the
other ranks do. The emulated wait counts as compute in every measurement, exactly as a slower
device would, so allocation strategies see the emulated cluster.

The wait is taken *before* the forward pass (predicted from the rank's recent real compute
time per sample): Horovod starts the gradient allreduce during ``backward()``, so a wait after
it would not delay the other ranks the way a slow device does.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from .errors import UsageError


def parse_speeds(text: str, n_ranks: int | None = None) -> list[float]:
    """``"1,1,1,0.33"`` -> floats, all > 0, and one per rank when ``n_ranks`` is given."""
    try:
        speeds = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--emulate-speed {text!r}: expected comma-separated numbers like 1,1,1,0.33") from None
    if not speeds or any(not (s > 0) or s == float("inf") for s in speeds):
        raise UsageError(f"--emulate-speed {text!r}: every speed must be a finite number > 0")
    if n_ranks is not None and len(speeds) != n_ranks:
        raise UsageError(f"--emulate-speed has {len(speeds)} entries but the job has {n_ranks} ranks; give one per rank")
    return speeds


def load_schedule(path: str, n_ranks: int) -> list[tuple[int, list[float]]]:
    """``--emulate-schedule FILE``: JSON ``[{"update": 0, "speeds": [1,1,1,1]}, {"update": 200, ...}]``.

    Returns ``(update, speeds)`` sorted by update; the first entry must start at update 0.
    """
    try:
        with open(path) as fh:
            raw = json.load(fh)
    except OSError as err:
        raise UsageError(f"--emulate-schedule {path}: cannot read ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise UsageError(f"--emulate-schedule {path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(raw, list) or not raw:
        raise UsageError(f"--emulate-schedule {path}: expected a JSON list of {{\"update\": U, \"speeds\": [...]}}")
    out = []
    for k, entry in enumerate(raw):
        if not isinstance(entry, dict) or "update" not in entry or "speeds" not in entry:
            raise UsageError(f"--emulate-schedule {path}: entry {k} needs keys 'update' and 'speeds'")
        update = entry["update"]
        if not isinstance(update, int) or update < 0:
            raise UsageError(f"--emulate-schedule {path}: entry {k} 'update' must be an integer >= 0")
        speeds = parse_speeds(",".join(str(s) for s in entry["speeds"]), n_ranks)
        out.append((update, speeds))
    out.sort(key=lambda e: e[0])
    if out[0][0] != 0:
        raise UsageError(f"--emulate-schedule {path}: the first entry must be at update 0")
    return out


@dataclass
class DeviceEmulator:
    """Per-rank emulated device. ``schedule`` is ``[(update, speeds), ...]`` from update 0."""

    rank: int
    rate: float                                  # samples/s of a speed-1 device
    schedule: list[tuple[int, list[float]]]
    real_per_sample: float | None = None         # EMA of real compute seconds per sample
    overruns: int = 0                            # steps whose real compute exceeded the target

    def speed(self, update: int) -> float:
        current = self.schedule[0][1]
        for start, speeds in self.schedule:
            if update >= start:
                current = speeds
        return current[self.rank]

    def target_seconds(self, batch_size: int, update: int) -> float:
        """How long the compute phase of this step must last."""
        return batch_size / (self.speed(update) * self.rate)

    def pre_wait(self, batch_size: int, update: int) -> float:
        """Seconds to wait before the forward pass so compute ends at the target."""
        predicted = (self.real_per_sample or 0.0) * batch_size
        return max(0.0, self.target_seconds(batch_size, update) - predicted)

    def record_real(self, batch_size: int, real_seconds: float, update: int) -> None:
        """Feed the real compute time of a step (excluding the wait)."""
        per_sample = real_seconds / max(1, batch_size)
        self.real_per_sample = per_sample if self.real_per_sample is None else \
            0.8 * self.real_per_sample + 0.2 * per_sample
        if real_seconds > self.target_seconds(batch_size, update):
            self.overruns += 1
