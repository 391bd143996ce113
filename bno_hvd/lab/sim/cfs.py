"""CPU time under a CFS bandwidth limit (a cgroup quota), for every rank at once.

A rank limited to ``L`` cores with a period of ``P`` s may run ``L * P`` CPU seconds in each
period, at full speed, and is throttled for the rest of it; budget left at a period's end is
lost. So a phase that needs ``w`` CPU seconds takes ``w`` s when the budget holds it, and about
``w / L`` s (in whole periods, plus the start of the last) when it does not: the quantisation the
REAL runs show (a 5 ms allreduce at 0.15 of a core and 10 ms periods takes ~40 ms). A rank that
spent its budget spinning in a wait meets the allreduce throttled.

:class:`Quota` holds each rank's period index and budget left; every method takes and returns
arrays over the ranks (``limit = inf``: no limit, the rank runs at its ``share`` of a core).
``cold``: CPU seconds a phase loses each time it is throttled and resumes (caches, the threads'
wake-up): the REAL logs show a rank at 0.15 of a core needing ~1.7x the CPU per sample of one at
0.45 (balanced's fits, ``per_sample_ms`` times the limit, 0.70 against 0.41 ms).
"""

from __future__ import annotations

import numpy as np


class Quota:
    """Per rank: a CFS limit (cores, inf = none), its period (s), a phase (s) and the budget state.

    ``share``: the fraction of a core the rank gets while runnable (1 / (1 + the busy processes and
    ranks on its core)); it slows every phase, limited or not."""

    def __init__(self, limit, period, phase, share, cold: float = 0.0):
        self.limit = np.asarray(limit, dtype=float)
        self.period = np.asarray(period, dtype=float)
        self.phase = np.asarray(phase, dtype=float)
        self.share = np.asarray(share, dtype=float)
        self.cold = float(cold)
        self.index = np.full(self.limit.shape, -np.inf)  # the period the budget belongs to
        self.budget = np.zeros(self.limit.shape)  # CPU s left in that period

    def set(self, limit, share) -> None:
        """A new limit or neighbours (a schedule): the budget is the new limit's from the next period."""
        self.limit = np.asarray(limit, dtype=float)
        self.share = np.asarray(share, dtype=float)

    def run(self, start, work, mask=None) -> np.ndarray:
        """When each rank finishes ``work`` CPU seconds begun at ``start`` (s); updates the budgets.
        Ranks outside ``mask`` are untouched (their finish is ``start``)."""
        start = np.asarray(start, dtype=float)
        work = np.asarray(work, dtype=float) / self.share  # wall at full quota speed is CPU / share
        mask = np.ones(start.shape, bool) if mask is None else mask
        finish = np.where(mask, start + work, start)
        limited = mask & np.isfinite(self.limit)
        if not limited.any():
            return finish
        p, q = self.period[limited], self.limit[limited] * self.period[limited]
        t, w = start[limited], work[limited]
        k = np.floor((t - self.phase[limited]) / p)
        budget = np.where(k > self.index[limited], q, self.budget[limited])
        end = self.phase[limited] + (k + 1) * p
        avail = np.minimum(budget, end - t)
        fits = w <= avail
        rest = w - avail
        useful = np.maximum(q - self.cold, 0.1 * q)  # of each period after a throttle
        m = np.maximum(np.ceil(rest / useful), 1.0)
        late = self.phase[limited] + (k + m) * p + (rest - (m - 1) * useful) + (q - useful)
        finish[limited] = np.where(fits, t + w, late)
        self.budget[limited] = np.where(fits, budget - w, m * useful - rest)
        self.index[limited] = np.where(fits, k, k + m)
        return finish

    def spin(self, start, until, rate, mask) -> np.ndarray:
        """A wait from ``start`` to ``until`` that burns ``rate`` CPU s per wall s (0: it sleeps);
        returns the CPU it burnt. A wait that would burn past ``until`` leaves the budget empty."""
        if rate <= 0:
            return np.zeros(start.shape)
        demand = rate * np.maximum(until - start, 0.0)
        done = self.run(start, demand, mask & (demand > 0))
        over = mask & (done > until)
        if over.any():
            k = np.floor((until[over] - self.phase[over]) / self.period[over])
            self.index[over], self.budget[over] = k, 0.0
        return np.where(mask, demand, 0.0)
