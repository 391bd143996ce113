"""Fault injection for reliability tests: real faults, at a chosen rank and update.

``bno-hvd train --inject-fault SPEC`` (a hidden flag) takes a comma-separated list of
``KIND:RANK:UPDATE`` entries:

* ``kill:R:U``        rank R sends itself SIGKILL at the start of update U (a dying rank: no
                      Python cleanup, no MPI_Finalize, exactly like an OOM kill);
* ``nan-loss:R:U``    rank R's loss becomes NaN at update U (so do the summed gradients);
* ``nan-metrics:R:U`` from update U on, rank R reports NaN throughput and memory to rank 0
                      (a broken sensor: the allocation must not be poisoned by it).

The faults are real (a real signal, real NaNs through Horovod and the control plane); only
*when* they happen is chosen, so that tests can place them between checkpoints.

Usage::

    faults = FaultInjector.parse("kill:2:25", rank).attach(balancer)
    faults.at_update(step.update)           # may not return
    loss = faults.poison_loss(loss, step.update)
"""
from __future__ import annotations

import dataclasses
import os
import signal
from dataclasses import dataclass

from .errors import UsageError

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
        if len(parts) != 3 or parts[0] not in KINDS or not all(p.isdigit() for p in parts[1:]):
            raise UsageError(f"--inject-fault entry {entry.strip()!r}: use KIND:RANK:UPDATE with KIND one of "
                             f"{', '.join(KINDS)}, e.g. kill:2:25")
        faults.append(Fault(parts[0], int(parts[1]), int(parts[2])))
    return faults


class FaultInjector:
    """The faults of one rank. With no faults every method is a no-op."""

    def __init__(self, faults: list[Fault], rank: int):
        self.rank = rank
        self.faults = [f for f in faults if f.rank == rank]

    @classmethod
    def parse(cls, spec: str | None, rank: int) -> "FaultInjector":
        return cls(parse_faults(spec), rank)

    def _at(self, kind: str, update: int) -> bool:
        return any(f.kind == kind and f.update == update for f in self.faults)

    def _from(self, kind: str, update: int) -> bool:
        return any(f.kind == kind and update >= f.update for f in self.faults)

    def at_update(self, update: int) -> None:
        """Start of an update: a ``kill`` fault ends this process here with SIGKILL."""
        if self._at("kill", update):
            os.kill(os.getpid(), signal.SIGKILL)

    def poison_loss(self, loss, update: int):
        """The loss, or NaN times it for a ``nan-loss`` fault (keeps the autograd graph)."""
        return loss * float("nan") if self._at("nan-loss", update) else loss

    def attach(self, balancer) -> "FaultInjector":
        """With a ``nan-metrics`` fault, make ``balancer``'s reports non-finite from its update on."""
        if any(f.kind == "nan-metrics" for f in self.faults):
            honest = balancer.report

            def report():
                # Decided at report time: the rebalance after update U-1 is the first one affected.
                rep = honest()
                if self._from("nan-metrics", balancer.update):
                    rep = dataclasses.replace(rep, ops=float("nan"), memory_used=float("nan"))
                return rep

            balancer.report = report
        return self
