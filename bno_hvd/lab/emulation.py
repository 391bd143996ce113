"""Heterogeneity *emulation*: make rank i behave like a device of relative speed f_i.

Rank i really computes its batch; its compute phase is then stretched to last
``b_i / (f_i * R)`` seconds (R: samples/s of a speed-1 device). Stretching measured compute
time instead would not work here: ranks share cores, so measured time depends on what the
other ranks do. The emulated wait counts as compute in every measurement, exactly as a slower
device would, so allocation strategies see the emulated cluster. It is the device's time, not
the CPU's: the rank's timer leaves it out of its CPU share (a rank that sleeps is not starved).

The wait is taken *before* the forward pass (predicted from the rank's recent real compute
time per sample): Horovod starts the gradient allreduce during ``backward()``, so a wait after
it would not delay the other ranks the way a slow device does.

Everything shown from an emulated run says EMULATED (:mod:`bno_hvd.lab.heterogeneity`). Real slow
ranks are :mod:`bno_hvd.lab.cpuquota`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import SPEED, RankSchedule, load_rank_schedule, parse_float_list
from bno_hvd.training.hooks import Hook


def parse_speeds(text: str, n_ranks: int | None = None) -> list[float]:
    """``"1,1,1,0.33"`` -> one relative speed per rank, each within :data:`bno_hvd.common.parsing.SPEED`."""
    return parse_float_list(text, "--emulate-speed", SPEED, n_ranks)


# The slowest emulated device must still compute a sample in 10 s: speed x rate >= 0.1 samples/s.
# (--emulate-speed 0.01 at --emulate-rate 0.1 would take 17 minutes per sample, a run that never ends.)
MIN_EMULATED_RATE = 0.1


def check_emulated_rate(speeds, rate: float, flag: str = "--emulate-speed") -> None:
    """Raise :class:`UsageError` when ``min(speeds) * rate`` is below :data:`MIN_EMULATED_RATE` samples/s."""
    slowest = min(speeds)
    if slowest * rate < MIN_EMULATED_RATE:
        raise UsageError(
            f"{flag} speed {slowest:g} at --emulate-rate {rate:g} emulates {slowest * rate:g} samples/s "
            f"({1 / (slowest * rate):g} s per sample); speed x rate must be >= {MIN_EMULATED_RATE:g} samples/s, "
            "raise --emulate-rate"
        )


def load_schedule(path: str, n_ranks: int) -> RankSchedule:
    """``--emulate-schedule FILE``: ``[{"update": 0, "speeds": [1,1,1,1]}, {"update": 200, ...}]``."""
    return load_rank_schedule(path, "--emulate-schedule", "speeds", SPEED, n_ranks)


@dataclass
class DeviceEmulator:
    """The emulated device of one rank (pure: the hook below does the waiting)."""

    rank: int
    rate: float  # samples/s of a speed-1 device
    schedule: RankSchedule
    real_per_sample: float | None = None  # EMA of real compute seconds per sample
    overruns: int = 0  # steps whose real compute exceeded the target

    def speed(self, update: int) -> float:
        return self.schedule.at(update)[self.rank]

    def target_seconds(self, batch_size: int, update: int) -> float:
        """How long the compute phase of this step must last."""
        return batch_size / (self.speed(update) * self.rate)

    def pre_wait(self, batch_size: int, update: int) -> float:
        """Seconds to wait before the forward pass so compute ends at the target."""
        predicted = (self.real_per_sample or 0.0) * batch_size
        return max(0.0, self.target_seconds(batch_size, update) - predicted)

    def record_real(self, batch_size: int, real_seconds: float, update: int) -> None:
        """Feed the real compute time of a step (excluding the wait); a step without samples (a
        rank that sat it out) says nothing about the time per sample."""
        if batch_size <= 0:
            return
        per_sample = real_seconds / max(1e-9, batch_size)
        self.real_per_sample = (
            per_sample if self.real_per_sample is None else 0.8 * self.real_per_sample + 0.2 * per_sample
        )
        if real_seconds > self.target_seconds(batch_size, update):
            self.overruns += 1


def emulated_units(step) -> float:
    """What a step's emulated time is proportional to: its samples, or for token sequences its
    work in average sequences (:mod:`bno_hvd.allocation.costmodel`: lengths and attention count)."""
    work = getattr(step, "emulated_work", None)
    if work is None:
        work = getattr(step, "work", None)
    return step.batch_size if work is None else work / 1000


class EmulationHook(Hook):
    """Stretches this rank's compute phase to its emulated duration."""

    def __init__(self, emulator: DeviceEmulator, clock=time.perf_counter, sleep=time.sleep):
        self.emulator = emulator
        self._clock, self._sleep = clock, sleep
        self._t0 = self._t_real = 0.0
        self._updates = 0
        self._idle = None  # the run's StepTimer.idle: the waits are the device's, not CPU starvation

    def start(self, run) -> None:
        self._idle = run.balancer.timer.idle

    def _wait(self, seconds: float) -> None:
        t = self._clock()
        self._sleep(seconds)
        if self._idle is not None:
            self._idle(self._clock() - t)

    def before_compute(self, step) -> None:
        self._t0 = self._clock()
        self._wait(self.emulator.pre_wait(emulated_units(step), step.update))
        self._t_real = self._clock()

    def after_compute(self, step) -> None:
        now = self._clock()
        self.emulator.record_real(emulated_units(step), now - self._t_real, step.update)
        target = self.emulator.target_seconds(emulated_units(step), step.update)
        if now - self._t0 < target:  # the prediction was short: finish the emulated compute phase
            self._wait(target - (now - self._t0))
        self._updates += 1

    def finish(self, comm) -> list[str]:
        overruns = comm.gather(self.emulator.overruns, root=0)
        if comm.Get_rank() != 0 or max(overruns) <= 0.05 * max(1, self._updates):
            return []
        worst = max(range(len(overruns)), key=overruns.__getitem__)
        return [
            f"rank {worst}'s real compute exceeded its emulated time in {overruns[worst]} of "
            f"{self._updates} updates; results are not a clean emulation, lower --emulate-rate"
        ]
