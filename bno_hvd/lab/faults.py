"""Fault injection for reliability tests: real faults, at a chosen rank and update.

``bno-hvd train --inject-fault SPEC`` (a hidden flag) takes a comma-separated list of
``KIND:RANK:UPDATE`` entries:

* ``kill:R:U``        rank R sends itself SIGKILL at the start of update U (a dying rank: no
                      Python cleanup, no MPI_Finalize, exactly like an OOM kill);
* ``nan-loss:R:U``    rank R's loss becomes NaN at update U (so do the summed gradients);
* ``nan-metrics:R:U`` from update U on, rank R reports NaN throughput and memory to rank 0
                      (a broken sensor: the allocation must not be poisoned by it).

The faults are real (a real signal, real NaNs through Horovod and the control plane); only
*when* they happen is chosen, so that tests can place them between checkpoints. The injector
is a :class:`bno_hvd.training.hooks.Hook`, built only when the flag is set.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from dataclasses import dataclass

from bno_hvd.common.errors import UsageError
from bno_hvd.training.hooks import Hook

KINDS = ("kill", "nan-loss", "nan-metrics")


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``kind`` on ``rank`` at (or from) update ``update``."""

    kind: str
    rank: int
    update: int


def parse_faults(spec: str | None) -> list[Fault]:
    """``"kill:2:25,nan-loss:0:3"`` -> Faults; raises :class:`UsageError` on a bad entry."""
    if not spec:
        return []
    faults = []
    for entry in spec.split(","):
        parts = entry.strip().split(":")
        if len(parts) != 3 or parts[0] not in KINDS or not all(p.isascii() and p.isdigit() for p in parts[1:]):
            raise UsageError(
                f"--inject-fault entry {entry.strip()[:40]!r}: use KIND:RANK:UPDATE with KIND one of "
                f"{', '.join(KINDS)}, e.g. kill:2:25"
            )
        faults.append(Fault(parts[0], int(parts[1]), int(parts[2])))
    return faults


class FaultInjector(Hook):
    """The faults of one rank, as a hook."""

    def __init__(self, faults: list[Fault], rank: int):
        self.rank = rank
        self.faults = [f for f in faults if f.rank == rank]

    @classmethod
    def parse(cls, spec: str | None, rank: int) -> FaultInjector:
        return cls(parse_faults(spec), rank)

    def _at(self, kind: str, update: int) -> bool:
        return any(f.kind == kind and f.update == update for f in self.faults)

    def _from(self, kind: str, update: int) -> bool:
        return any(f.kind == kind and update >= f.update for f in self.faults)

    def before_compute(self, step) -> None:
        """Start of an update: a ``kill`` fault ends this process here with SIGKILL."""
        if self._at("kill", step.update):
            os.kill(os.getpid(), signal.SIGKILL)

    def loss(self, loss, step):
        """The loss, or NaN times it for a ``nan-loss`` fault (keeps the autograd graph)."""
        return loss * float("nan") if self._at("nan-loss", step.update) else loss

    def report(self, report, update: int):
        """From a ``nan-metrics`` fault's update on, report NaN throughput and memory.

        ``update`` is the number of updates done: the rebalance after update U-1 is the first one
        affected."""
        if self._from("nan-metrics", update):
            return dataclasses.replace(report, ops=float("nan"), memory_used=float("nan"))
        return report
