"""When ``balanced`` lets a rank sit out (0 samples, no part in the allreduce), and when it is back.

Two ways in, both for the rank that costs most, never rank 0, one rank at a time:

* **Predicted.** The rank slowest at the split sits out when the global batch split over the
  others is predicted to finish an update sooner by more than the deadband's threshold: its own
  time at its share (at least one sample, its throttled sync and arrival penalty in the model's
  offsets) is then the whole step's.
* **Measured (a trial).** What a rank costs inside the allreduce is not always in the model: a
  rank sharing its core with busy processes has no CPU limit to charge, and its part of every
  ring step waits for the scheduler (seen: 118 ms of sync per update with it, 43 ms without, at
  the same compute). A rank that gets less than ``starved_share`` of the others' share of the CPU
  (:attr:`ClusterMetrics.cpu_share`: the time it ran over the time it could run; and of their
  CPU per wall second, :func:`starved`) is sat out for one interval, and rank 0's measured
  update time (:attr:`ClusterMetrics.cycle_samples`) decides: it stays out only if the updates
  without it were faster by more than the threshold and their noise. A rank
  is tried out only while the split is the fit's (the rebalance keeps it, within the deadband):
  the interval the trial is measured against must be the best split with it, not the even split
  of the first interval (seen: a trial at update 4 measured 322 ms both ways at 16,16; the fit's
  21,11 then took 224 ms). A rank that is not runnable (waiting for its
  device, a slower GPU or an EMULATED one, or with less work) is not starved
  (:meth:`bno_hvd.library.timing.StepTimer.cpu_share`). A trial
  that does not pay is not tried again for ``sit_out`` rebalances, then twice as long each time;
  nor is a rank tried out within that long after it came back, nor one whose fit is gone (its
  limit rose: it is measured at its share first).

A rank that sits out stays out unless its CPU limit rose (its fit is gone), the model predicts
its return pays (not after a measured gain: the model did not see it), or it has been out for
``sit_out`` rebalances: then it is measured again at its share. If the interval with it back is
measured slower than the last one without it by the same margin, it sits out again at once, for
twice as long.

Pure, like every strategy: all numbers come in with the :class:`ClusterMetrics`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bno_hvd.allocation.fitting import predicted_step, split_without, step_time
from bno_hvd.allocation.metrics import ClusterMetrics


@dataclass(frozen=True)
class Measured:
    """The median of rank 0's update times over some updates, with its relative standard error."""

    seconds: float
    noise: float
    count: int

    def faster_than(self, other: Measured, threshold: float, sigmas: float) -> bool:
        """Faster than ``other`` by more than ``threshold`` (a fraction) and ``sigmas`` standard errors."""
        gain = 1.0 - self.seconds / other.seconds
        return gain > threshold and gain > sigmas * math.hypot(self.noise, other.noise)


def measured_step(metrics: ClusterMetrics, since: int, rank: int | None = None, present: bool = True):
    """Rank 0's update time over its updates from ``since`` on (None: fewer than 3).

    With ``rank``: only the updates that rank took part in (``present``) or sat out (it reports
    the sync of every update it took part in). Every rank leaves the allreduce together, so rank
    0's whole update (its gap, compute and sync) is the cluster's update time. Median and a
    robust standard error (1.4826 MAD), since single updates jitter by a quota period."""
    cycles = [(int(u), float(t)) for u, t in metrics.cycle_samples[0] if int(u) >= since and t > 0]
    if rank is not None:
        took_part = {int(u) for u, _ in metrics.sync_samples[rank]}
        cycles = [(u, t) for u, t in cycles if (u in took_part) == present]
    if len(cycles) < 3:
        return None
    t = np.array([t for _, t in cycles])
    med = float(np.median(t))
    se = 1.2533 * 1.4826 * float(np.median(np.abs(t - med))) / math.sqrt(t.size)
    return Measured(med, se / med, int(t.size))


def starved(metrics: ClusterMetrics, share: float) -> int | None:
    """The rank (never 0) that gets the least share of the CPU, if below ``share`` of the
    median of the others, and its CPU per wall second too where known; None when no rank is
    (or the shares are not known). The two err apart: a rank with less work or a slower device
    uses less CPU per second but is not runnable more; a rank whose spinning threads queue
    behind busy neighbours is runnable more but uses as much CPU per second."""
    got = np.array([np.nan if x is None else float(x) for x in metrics.cpu_share])
    if share <= 0 or got.size < 2 or not np.isfinite(got).all() or (got <= 0).all():
        return None
    r = 1 + int(np.argmin(got[1:]))
    if share_of_others(metrics.cpu_share, r) >= share:
        return None
    per_wall = metrics.cpu_per_wall
    if _known(per_wall) and share_of_others(per_wall, r) >= share:
        return None
    return r


def _known(shares) -> bool:
    return all(x is not None and x > 0 for x in shares)


def share_of_others(shares, r: int) -> float:
    """Rank ``r``'s share over the median of the other ranks'."""
    got = np.array(shares, dtype=float)
    return float(got[r] / np.median(np.delete(got, r)))


class SitOuts:
    """The sit-out decisions of one ``balanced`` (see the module doc)."""

    def __init__(self, every: int, starved_share: float):
        self.every = int(every)  # rebalances out before a rank is measured again; 0: never sits out
        self.starved_share = float(starved_share)
        self.out_for = 0  # rebalances the rank that sits out has been out
        self.period = self.every  # ... before it is measured again (doubles while it measures slower)
        self.since = 0  # update of the last rebalance: the interval measured at this one starts here
        self.trial: dict | None = None  # {"rank", "with"}: a rank sat out to measure the update without it
        self.back: dict | None = None  # {"rank", "without"}: a rank back to be measured, and the update without it
        self.next_trial: dict[int, int] = {}  # rank -> the rebalance count from which it may be tried again
        self.wait: dict[int, int] = {}  # rank -> rebalances until a new trial after its last one failed
        self.count = 0  # rebalances seen
        self.measured = False  # the rank out is out because it measured faster: the model cannot call it back

    def decide(self, model, sizes, current, known, metrics, update, global_batch, threshold, sigmas, settled):
        """``(sizes, note, back)``: the split (one rank may have 0), why it differs from the fit's
        (None: it does not), and the rank that just came back (None: none). ``settled``: the
        current split is the fit's (within the deadband); only then is a rank tried out."""
        since, self.since = self.since, int(update)
        self.count += 1
        was = [i for i, b in enumerate(current) if b == 0]
        if was:
            return self._while_out(model, sizes, was[0], known, metrics, since, global_batch, threshold, sigmas)
        back, self.back = self.back, None
        if back is not None:  # measured again: out at once if the update was faster without it
            r, without = back["rank"], Measured(*back["without"])
            now = measured_step(metrics, since, r, present=True)
            if now is not None and without.faster_than(now, threshold, sigmas):
                self.out_for, self.period, self.measured = 0, 2 * self.period, True
                return split_without(model, r, global_batch), _measured(r, without, now, "sits out again"), None
            # not slower with it (its neighbours left, say): no trial of it for a while either
            self.period, self.next_trial[r] = self.every, self.count + self.wait.get(r, self.every)
        times = step_time(*model[:2], sizes, *model[2:])
        r = 1 + int(np.argmax(times[1:]))
        without = split_without(model, r, global_batch)
        step_with, step_without = predicted_step(model, sizes), predicted_step(model, without)
        if step_without < (1 - threshold) * step_with:
            self.out_for, self.measured = 0, False
            return (
                without,
                (
                    f"rank {r} sits out: an update is predicted to take {1e3 * step_without:.0f} ms without it, "
                    f"{1e3 * step_with:.0f} ms with it at {sizes[r]} sample(s)"
                ),
                None,
            )
        r = starved(metrics, self.starved_share)
        if r is None or not settled or not known[r] or self.count < self.next_trial.get(r, 0):
            return sizes, None, None  # (a rank whose fit is gone, its limit rose: measured at its share first)
        now = measured_step(metrics, since)
        if now is None:
            return sizes, None, None
        self.trial = {"rank": r, "with": [now.seconds, now.noise, now.count]}
        note = (
            f"rank {r} is tried out for one interval: it gets {share_of_others(metrics.cpu_share, r):.2f} of "
            f"the others' share of the CPU{_per_wall(metrics, r)}"
        )
        return split_without(model, r, global_batch), note, None

    def _while_out(self, model, sizes, r, known, metrics, since, global_batch, threshold, sigmas):
        without = measured_step(metrics, since, r, present=False)
        trial, self.trial = self.trial, None
        if trial is not None and trial["rank"] == r:
            before = Measured(*trial["with"])
            if without is not None and without.faster_than(before, threshold, sigmas):
                self.out_for, self.period, self.measured = 1, self.every, True
                return split_without(model, r, global_batch), _measured(r, without, before, "sits out"), None
            wait = self.wait.get(r, self.every)
            self.wait[r], self.next_trial[r] = 2 * wait, self.count + wait
            told = "too few updates" if without is None else f"{1e3 * without.seconds:.0f} ms per update"
            note = f"rank {r} is back: its trial measured {told} without it, {1e3 * before.seconds:.0f} ms with it"
            return sizes, note, r
        self.out_for += 1
        other = split_without(model, r, global_batch)
        pays = not self.measured and predicted_step(model, sizes) < (1 - threshold) * predicted_step(model, other)
        why = ((not known[r], "its CPU limit rose"), (pays, "the model predicts its return pays"))
        out = f"after {self.period} rebalance{'s' * (self.period > 1)} out, to be measured again"
        why += ((self.out_for > self.period, out),)
        reason = next((text for hit, text in why if hit), None)
        if reason is None:
            return other, None, None
        if without is not None and known[r]:
            self.back = {"rank": r, "without": [without.seconds, without.noise, without.count]}
        self.next_trial[r] = self.count + 1 + self.wait.get(r, self.every)  # measured at its share first
        return sizes, f"rank {r} is back: {reason}", r

    def state_dict(self) -> dict:
        keys = ("out_for", "period", "since", "trial", "back", "count", "measured")
        return {
            **{k: getattr(self, k) for k in keys},
            "next_trial": [[int(r), int(c)] for r, c in self.next_trial.items()],
            "wait": [[int(r), int(c)] for r, c in self.wait.items()],
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("out_for", "period", "since", "count"):
            setattr(self, key, int(state.get(key, getattr(self, key))))
        self.trial, self.back = state.get("trial"), state.get("back")
        self.measured = bool(state.get("measured", False))
        self.next_trial = {int(r): int(c) for r, c in state.get("next_trial", [])}
        self.wait = {int(r): int(c) for r, c in state.get("wait", [])}


def _per_wall(metrics: ClusterMetrics, r: int) -> str:
    if not _known(metrics.cpu_per_wall):
        return ""
    return f" ({share_of_others(metrics.cpu_per_wall, r):.2f} of their CPU per wall second)"


def _measured(r: int, without: Measured, with_: Measured, what: str) -> str:
    return (
        f"rank {r} {what}: measured {1e3 * without.seconds:.0f} ms per update without it, "
        f"{1e3 * with_.seconds:.0f} ms with it"
    )
