"""What the simulator is told: the calibrated machine (:class:`Machine`) and one profile of ranks
(:class:`SimProfile`). Units: seconds, CPU seconds, cores, samples."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import numpy as np

from bno_hvd.common.errors import UsageError

CALIBRATION = os.path.join(os.path.dirname(__file__), "calibration.json")


@dataclass(frozen=True)
class Machine:
    """The costs every rank shares, fitted from the REAL suite's logs (:mod:`.calibration`).

    Compute: a rank with ``b`` samples needs ``fixed_cpu + per_sample_cpu * b`` CPU s per update
    (its gap before the step and its compute), ``pass_cpu`` more per extra micro-batch over a
    memory cap; for text a sequence of ``n`` tokens costs ``per_token_cpu * n + per_square_cpu *
    n**2`` instead of ``per_sample_cpu``. A throttled phase loses ``cold`` CPU s each time it
    resumes (:class:`~bno_hvd.lab.sim.cfs.Quota`). Among busy processes a rank gets ``1 / (1 +
    busy_weight * busy)`` of its core (the scheduler favours a process that slept: a rank among 5
    busy processes got ~1/4, not 1/6).

    Sync: each rank's part of the allreduce needs ``sync_cpu`` CPU s at its own limit, of which
    ``overlap`` is done during its backward pass (Horovod reduces gradients as they come out), plus
    ``wake`` s per busy process on its core (run late at every ring step); the allreduce ends with
    the slowest part, and no sooner than ``network`` s after the last arrival at 4 ranks (the
    suite's; a ring moves ``2 (N - 1) / N`` of the gradients through each rank, so N ranks take
    ``network * (2 (N - 1) / N) / 1.5``). Then each rank takes its optimizer step, ``step_cpu`` CPU
    s at its own limit, which no other rank waits for (it delays only that rank's next step). A
    waiting rank burns ``spin`` CPU s per wall s before the last arrival (Gloo sleeps: near 0; MPI
    polls: near 1), ``ring_spin`` after its own part. A rank's other threads (Horovod's background
    loop) take ``tax`` CPU s per wall s of its CPU limit, at most half of it.

    Every rank waits for the slowest one's optimizer step and ``rebalance`` s at every rebalance,
    and ``rejoin`` s more when a rank comes back from sitting out (its state is sent to it, the
    process sets change); ``noise``: quantiles of one step's deviation from
    its interval's median, from recorded updates."""

    fixed_cpu: float
    per_sample_cpu: float
    sync_cpu: float
    network: float
    spin: float
    ring_spin: float
    wake: float
    rebalance: float
    cold: float = 0.0
    busy_weight: float = 1.0
    rejoin: float = 0.0
    overlap: float = 0.0
    tax: float = 0.0
    step_cpu: float = 0.0
    pass_cpu: float = 0.0
    per_token_cpu: float = 0.0
    per_square_cpu: float = 0.0
    noise: tuple = (0.0,)
    fitted_on: tuple = ()

    @classmethod
    def load(cls, path: str = CALIBRATION) -> Machine:
        """The calibration file's machine (the committed one by default)."""
        try:
            with open(path) as fh:
                data = json.load(fh)
            return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data["machine"].items()})
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UsageError(f"cannot read the simulator's calibration {path}: {err}") from None

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass
class SimProfile:
    """One way N ranks differ. Per rank: ``limits`` (cores, inf = none), ``busy`` (busy processes
    on its core), ``mates`` (other ranks on its core, computing when it does), ``speed`` (an
    EMULATED device: it waits ``1 / speed - 1`` times its compute more, asleep), ``caps`` (samples
    per forward/backward pass, 0 = none). ``schedule``: ``(update, limits, busy)`` changes;
    ``text``: ``(mean tokens, spread)`` of a sequence's length (lognormal), None for images.
    ``hand``: each rank's speed as a user would guess it (the ``fixed`` split)."""

    name: str
    limits: list
    period_ms: float = 10.0
    busy: list = field(default_factory=list)
    mates: list = field(default_factory=list)
    speed: list = field(default_factory=list)
    caps: list = field(default_factory=list)
    schedule: list = field(default_factory=list)
    text: tuple | None = None
    global_batch: int = 0
    hand: list = field(default_factory=list)
    kind: str = "SIMULATED"

    def __post_init__(self):
        n = self.n
        self.limits = [float(x) for x in self.limits]
        self.busy = list(self.busy) or [0] * n
        self.mates = list(self.mates) or [0] * n
        self.speed = list(self.speed) or [1.0] * n
        self.caps = list(self.caps) or [0] * n
        self.global_batch = int(self.global_batch) or 32 * n
        self.hand = list(self.hand) or [min(x, 1.0) for x in self.limits]
        if n < 1 or any(len(x) != n for x in (self.busy, self.mates, self.speed, self.caps, self.hand)):
            raise UsageError(f"profile {self.name}: give one limit, busy count, speed, cap and hand weight per rank")
        if self.global_batch < n:
            raise UsageError(f"profile {self.name}: a global batch of {self.global_batch} cannot feed {n} ranks")

    @property
    def n(self) -> int:
        return len(self.limits)

    def share(self, busy=None, busy_weight: float = 1.0) -> np.ndarray:
        """Each rank's fraction of a core while it runs: its core's runnable processes split it
        (a busy process counts ``busy_weight``: see :class:`Machine`)."""
        busy = self.busy if busy is None else busy
        return 1.0 / (1.0 + busy_weight * np.asarray(busy, float) + np.asarray(self.mates, float))

    def hand_split(self) -> list[int]:
        """The split a user would write by hand: the global batch in proportion to ``hand``."""
        from bno_hvd.allocation.rounding import round_to_total

        total = sum(self.hand)
        return round_to_total([self.global_batch * h / total for h in self.hand], self.global_batch, 1)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["limits"] = [None if not np.isfinite(x) else x for x in self.limits]
        out["schedule"] = [
            [u, [None if not np.isfinite(x) else x for x in lim], list(b)] for u, lim, b in self.schedule
        ]
        return out
