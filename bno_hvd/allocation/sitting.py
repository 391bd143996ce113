"""When ``balanced`` lets ranks sit out (0 samples, no part in the allreduce), and when they are back.

Any ranks but 0 may be out at once. Two ways in:

* **Predicted.** Ranks ordered by their predicted time at one sample (their throttled sync is in
  the model's offsets), the ``k`` slowest sit out, for the ``k`` whose split over the others is
  predicted fastest, when faster by more than the deadband's threshold (of four ranks equally
  starved none alone is worth removing: one at a time held them at 1 sample each).
* **Measured (a trial).** A rank sharing its core with busy processes has no CPU limit to charge,
  and its part of every ring step waits for the scheduler (seen: 118 ms of sync per update with
  it, 43 ms without, at the same compute). A rank that gets less than ``starved_share`` of the
  others' share of the CPU (:func:`starved`: run over runnable time, and CPU per wall second, so
  a rank waiting for its device or with less work is not starved) is sat out for one interval,
  and rank 0's measured update time (:attr:`ClusterMetrics.cycle_samples`) decides: it stays out
  only if the updates without it were faster by more than the threshold and their noise. One
  rank is tried at a time, at a rebalance that changes nothing else, against the split that ran
  before, whether or not the fit moves it (waiting for a rebalance the fit does not move held a
  rank at 0.15 of the others' share in for 9 intervals on REAL competing-process); a keep
  measured against a poor split is undone when the rank is measured again. A rank whose CPU
  limit binds is never tried: the model charges its limit (trials of ranks at 0.38 of a core
  beside ranks at 0.88 took 4 intervals of 11 at random-40-411 in the simulator, 9% of its
  rate). A trial that does not pay is not repeated for ``sit_out``
  rebalances, then twice as long each time; nor is a rank tried within that long after it came
  back, nor one whose fit is gone (its limit rose).

A rank out stays out unless its CPU limit rose (its fit is gone), the model predicts its return
pays by twice the threshold (its fit is from before it left, the others' are new: at the threshold
alone ranks near the edge went out and back on the fits' noise, at random-40-40 to 545 ms per
update with the rank back against 72 without it; not after a measured gain: the model did not see
it), or, with no limit that binds, it has been out for ``sit_out`` rebalances: then it is measured
again at its share (ranks due together, together). If the interval with them back is measured
slower than the last one without them by the same margin, they sit out again at once, for twice
as long. A limit that binds is read at every rebalance, so a rank out under one is not measured
again while it stays (each such check cost an interval at up to 2.8x the update on the
simulator's REAL profiles, 4.6% of the 1,000).

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


def starved(metrics: ClusterMetrics, share: float, out=()) -> int | None:
    """The rank (never 0, none in ``out``) that gets the least share of the CPU, if below
    ``share`` of the median of the others in, and its CPU per wall second too where known; None
    when no rank is (or the shares are not known). The two err apart: a rank with less work or a
    slower device uses less CPU per second but is not runnable more; a rank whose spinning
    threads queue behind busy neighbours is runnable more but uses as much CPU per second."""
    live = [i for i in range(len(metrics.cpu_share)) if i not in out]
    got = np.array([np.nan if metrics.cpu_share[i] is None else float(metrics.cpu_share[i]) for i in live])
    if share <= 0 or got.size < 2 or not np.isfinite(got).all() or (got <= 0).all():
        return None
    free = [j for j in range(1, len(live)) if metrics.cpu_limit[live[j]] is None]  # (a limit is charged)
    if not free:
        return None
    r = live[min(free, key=lambda j: got[j])]
    if share_of_others(metrics.cpu_share, r, out) >= share:
        return None
    per_wall = [metrics.cpu_per_wall[i] for i in live]
    if all(x is not None and x > 0 for x in per_wall) and share_of_others(metrics.cpu_per_wall, r, out) >= share:
        return None
    return r


def share_of_others(shares, r: int, out=()) -> float:
    """Rank ``r``'s share over the median of the other ranks' (none in ``out``)."""
    others = [float(x) for i, x in enumerate(shares) if i != r and i not in out]
    return float(shares[r]) / float(np.median(others))


class SitOuts:
    """The sit-out decisions of one ``balanced`` (see the module doc)."""

    most: int | None = None  # the most ranks out at once (None: all but rank 0; 1 in the ablation)

    def __init__(self, every: int, starved_share: float):
        self.every = int(every)  # rebalances out before a rank is measured again; 0: never sits out
        self.starved_share = float(starved_share)
        self.out: dict[int, list] = {}  # rank out -> [rebalances out, ... before it is measured, out as measured]
        self.since = 0  # update of the last rebalance: the interval measured at this one starts here
        self.trial: dict | None = None  # {"rank", "with"}: a rank sat out to measure the update without it
        self.back: dict | None = None  # {"ranks", "without", "period"}: ranks back to be measured
        self.next_trial: dict[int, int] = {}  # rank -> the rebalance count from which it may be tried again
        self.wait: dict[int, int] = {}  # rank -> rebalances until a new trial after its last one failed
        self.count = 0  # rebalances seen
        self.unknown = [0, self.every, False]  # the record of a rank out without one (an old checkpoint's)

    def decide(self, model, sizes, current, known, metrics, update, global_batch, threshold, sigmas, whole):
        """``(sizes, note)``: the split (ranks out have 0) and why it differs from the fit's (None:
        it does not). ``whole``: ``current`` splits the global batch (only then is a rank tried out)."""
        since, self.since = self.since, int(update)
        self.count += 1
        out = {i for i, b in enumerate(current) if b == 0}
        self.out, self.unknown = {r: self.out.get(r) or list(self.unknown) for r in out}, [0, self.every, False]
        at = (metrics, since, threshold, sigmas)
        (trial, self.trial), (back, self.back), notes = (self.trial, None), (self.back, None), []
        done = set()  # ranks decided on already at this rebalance
        if trial is not None and trial["rank"] in out:
            done, note = {trial["rank"]}, self._trial_ended(trial["rank"], Measured(*trial["with"]), out, *at)
            notes.append(note)
        elif back is not None and not out & set(back["ranks"]):  # measured again: out at once if slower with them
            done, without = set(back["ranks"]), Measured(*back["without"])
            now = measured_step(metrics, since, back["ranks"][0])
            if now is not None and without.faster_than(now, threshold, sigmas):
                out.update(done)
                self.out.update({r: [0, 2 * back["period"], True] for r in done})
                notes.append(_measured(back["ranks"], without, now, again=True))
            else:  # not slower with them (their neighbours left, say): no trial of them for a while either
                self.next_trial.update({r: self.count + self.wait.get(r, self.every) for r in done})
        for r in out - done:
            self.out[r][0] += 1
        if not notes:
            notes += self._back(sorted(out - done), model, out, known, global_batch, metrics, since, threshold)
        if not notes:
            notes.append(self._predicted(model, out, global_batch, threshold))
        if not any(notes) and whole:
            notes.append(self._try_out(out, known, metrics, since))
        notes, self.out = [n for n in notes if n], {r: v for r, v in self.out.items() if r in out}
        return (split_without(model, out, global_batch) if out else list(sizes)), "; ".join(notes) or None

    def _trial_ended(self, r, before, out, metrics, since, threshold, sigmas) -> str:
        without = measured_step(metrics, since, r, present=False)
        if without is not None and without.faster_than(before, threshold, sigmas):
            self.out[r] = [1, self.every, True]
            return _measured([r], without, before)
        wait = self.wait.get(r, self.every)
        self.wait[r], self.next_trial[r] = 2 * wait, self.count + wait
        out.discard(r)
        told = "too few updates" if without is None else f"{1e3 * without.seconds:.0f} ms per update"
        return f"rank {r} is back: its trial measured {told} without it, {1e3 * before.seconds:.0f} ms with it"

    def _back(self, ranks, model, out, known, global_batch, metrics, since, threshold) -> list[str]:
        """The ranks out that are back (together, measured together at the next rebalance), and why."""
        now, came, why_back = predicted_step(model, split_without(model, out, global_batch)), [], {}
        for r in ranks:
            out_for, period, measured = self.out[r]
            other = predicted_step(model, split_without(model, out - {r}, global_batch))
            due = out_for > period and metrics.cpu_limit[r] is None  # (a limit that binds is read instead)
            why = (
                (not known[r], "its CPU limit rose"),
                (not measured and other < (1 - 2 * threshold) * now, "the model predicts its return pays"),
                (due, f"after {period} rebalance{'s' * (period > 1)} out, to be measured again"),
            )
            reason = next((text for hit, text in why if hit), None)
            if reason is not None:
                came.append(r)
                why_back.setdefault(reason, []).append(r)
                self.next_trial[r] = self.count + 1 + self.wait.get(r, self.every)  # measured at its share first
        without = measured_step(metrics, since, came[0], present=False) if came else None
        fitted = [r for r in came if known[r]]  # (a rank whose limit rose is measured by its fit)
        if without is not None and fitted:
            period = max(self.out[r][1] for r in fitted)
            self.back = {"ranks": fitted, "without": [without.seconds, without.noise, without.count], "period": period}
        out.difference_update(came)
        return [f"{_who(rs, 'is', 'are')[0]} back: {reason}" for reason, rs in why_back.items()]

    def _predicted(self, model, out, global_batch, threshold) -> str | None:
        """The k ranks slowest at one sample sit out, for the k predicted fastest (see the module doc)."""
        one = step_time(*model[:2], np.ones(len(model[0])), *model[2:4])
        rest = sorted((i for i in range(1, len(one)) if i not in out), key=lambda i: (-one[i], -i))
        room = len(rest) if self.most is None else min(max(self.most - len(out), 0), len(rest))
        now = split_without(model, out, global_batch)
        times = [predicted_step(model, now)]  # (k = 0: the split with every rank not out already)
        times += [
            predicted_step(model, split_without(model, out | {*rest[:k]}, global_batch)) for k in range(1, room + 1)
        ]
        k = int(np.argmin(times))
        if times[k] >= (1 - threshold) * times[0]:
            return None
        leave = sorted(rest[:k])
        out.update(leave)
        self.out.update({r: [0, self.every, False] for r in leave})
        who, it = _who(leave)
        return (
            f"{who} out: an update is predicted to take {1e3 * times[k]:.0f} ms without {it}, "
            f"{1e3 * times[0]:.0f} ms with {it} at {', '.join(str(now[r]) for r in leave)} sample(s)"
        )

    def _try_out(self, out, known, metrics, since) -> str | None:
        """A starved rank sat out for one interval, to measure the update without it."""
        r = None if self.most is not None and len(out) >= self.most else starved(metrics, self.starved_share, out)
        if r is None or not known[r] or self.count < self.next_trial.get(r, 0):
            return None  # (a rank whose fit is gone, its limit rose: measured at its share first)
        now = measured_step(metrics, since)
        if now is None:
            return None
        self.trial = {"rank": r, "with": [now.seconds, now.noise, now.count]}
        share = share_of_others(metrics.cpu_share, r, out)
        out.add(r)
        self.out[r] = [0, self.every, False]
        return f"rank {r} is tried out for one interval: it gets {share:.2f} of the others' share of the CPU"

    def state_dict(self) -> dict:
        return {
            **{k: getattr(self, k) for k in ("since", "trial", "back", "count")},
            "out": [[int(r), *v] for r, v in sorted(self.out.items())],
            **{k: [[int(r), int(c)] for r, c in getattr(self, k).items()] for k in ("next_trial", "wait")},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore; a checkpoint of the one-rank sit-out loads too (its ``out_for``, ``period`` and
        ``measured`` are the record of the rank out at the next rebalance)."""
        self.since, self.count = int(state.get("since", self.since)), int(state.get("count", self.count))
        self.trial, self.back = state.get("trial"), state.get("back")
        self.out = {int(r): [int(n), int(p), bool(m)] for r, n, p, m in state.get("out", [])}
        old = [int(state.get("out_for", 0)), int(state.get("period", self.every)), bool(state.get("measured", False))]
        self.unknown = old if "out_for" in state else [0, self.every, False]
        if self.back is not None and "rank" in self.back:  # the one-rank sit-out's
            self.back = {"ranks": [self.back["rank"]], "without": self.back["without"], "period": old[1]}
        self.next_trial = {int(r): int(c) for r, c in state.get("next_trial", [])}
        self.wait = {int(r): int(c) for r, c in state.get("wait", [])}


def _who(ranks, one: str = "sits", many: str = "sit") -> tuple[str, str]:
    """``("rank 3 sits", "it")`` or ``("ranks 4, 5 and 6 sit", "them")``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]} {one}", "it"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]} {many}", "them"


def _measured(ranks, without: Measured, with_: Measured, again: bool = False) -> str:
    who, it = _who(ranks)
    return (
        f"{who} out{' again' * again}: measured {1e3 * without.seconds:.0f} ms per update without {it}, "
        f"{1e3 * with_.seconds:.0f} ms with {it}"
    )
