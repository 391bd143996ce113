"""Random profile families for the simulator, and running every strategy on them.

:func:`random_profile` draws one profile: 2-64 ranks; a CFS period of 5-100 ms; fast ranks at
0.3-1 core and 1-3 slow levels down to 0.05; sometimes ranks among busy processes instead of a
limit, a neighbour that arrives and leaves (a schedule), memory caps, text of random lengths.
:func:`run_families` runs each strategy on each profile (the same seed: the same noise) and
returns one row per profile with its parameters and ``rates`` (samples/s per strategy; ``fixed``
is the split proportional to the limits a user would write).
"""

from __future__ import annotations

import math
import time

import numpy as np

from bno_hvd.common.parsing import SEED
from bno_hvd.lab.sim.engine import simulate
from bno_hvd.lab.sim.machine import Machine, SimProfile

RANK_COUNTS = (2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
DEFAULT_STRATEGIES = ("equal", "balanced", "lbbsp", "proportional", "fixed")


def random_profile(rng: np.random.Generator, name: str, updates: int = 120) -> SimProfile:
    """One random profile (see the module doc); its schedule falls within ``updates``."""
    n = int(rng.choice(RANK_COUNTS))
    period = float(np.exp(rng.uniform(np.log(5.0), np.log(100.0))))
    fast = rng.uniform(0.3, 1.0)
    levels = rng.uniform(0.05, 0.8 * fast, size=int(rng.integers(1, 4)))
    level = rng.integers(0, levels.size + 1, size=n)  # 0: fast
    level[0] = 0 if rng.random() < 0.7 else level[0]
    limits = np.where(level == 0, fast, levels[np.maximum(level - 1, 0)])
    busy = np.zeros(n, int)
    if rng.random() < 0.2:  # some ranks share their core with busy processes, no limit
        hit = rng.random(n) < 0.3
        busy[hit] = rng.integers(1, 6, size=int(hit.sum()))
        limits = np.where(hit, math.inf, limits)
    schedule = []
    if rng.random() < 0.3:  # a neighbour arrives on one rank's core and leaves again
        r = int(rng.integers(n))
        start = int(rng.integers(updates // 5, updates // 2))
        stop = int(rng.integers(start + updates // 10, updates))
        during = limits.copy()
        during[r] = max(0.05, limits[r] * rng.uniform(0.2, 0.6)) if np.isfinite(limits[r]) else during[r]
        more = busy.copy()
        more[r] += 0 if np.isfinite(limits[r]) else int(rng.integers(1, 4))
        schedule = [(start, during.tolist(), more.tolist()), (stop, limits.tolist(), busy.tolist())]
    caps = np.where(rng.random(n) < 0.15, rng.integers(4, 33, size=n), 0) if rng.random() < 0.2 else np.zeros(n, int)
    text = (float(rng.uniform(32, 256)), float(rng.uniform(0.2, 1.0))) if rng.random() < 0.2 else None
    base = int(rng.choice((16, 32, 64)))
    hand = [1.0 / (1 + b) if not np.isfinite(x) else float(x) for x, b in zip(limits, busy)]
    return SimProfile(
        name,
        limits.tolist(),
        round(period, 2),
        busy=busy.tolist(),
        caps=caps.tolist(),
        schedule=schedule,
        text=text,
        global_batch=base * n,
        hand=hand,
    )


def run_seed(seed: int, k: int, round_: int = 0) -> int:
    """The noise seed of profile ``k``'s run in round ``round_`` (round 0: the single run's), in the
    range every strategy's seed takes: wrapped modulo 2**32, which leaves unchanged every seed below
    about 42,900 (and so every figure measured before the wrap)."""
    return (seed * 100003 + k + 7919 * round_) % (SEED.high + 1)


def pooled_rate(runs, warmup: int = 20) -> float:
    """Samples/s of ``runs`` over their updates after ``warmup``: all samples over all seconds."""
    return float(sum(r.samples[warmup:].sum() for r in runs) / sum(r.seconds[warmup:].sum() for r in runs))


def run_families(
    machine: Machine, count: int, seed: int, strategies=DEFAULT_STRATEGIES, updates=120, warmup=20, echo=None, rounds=1
):
    """``count`` random profiles from ``seed``; per profile its parameters and every strategy's
    samples/s over the updates after ``warmup`` (of ``rounds`` runs with their own noise and CFS
    phases, pooled: under a long period one run's rate moves by 10-20% with the phases alone).
    ``echo(done, count)`` reports progress."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(count):
        profile = random_profile(rng, f"random-{seed}-{k}", updates)
        rates = {}
        for spec in strategies:
            runs = [simulate(profile, machine, spec, updates, seed=run_seed(seed, k, j)) for j in range(rounds)]
            rates[spec] = pooled_rate(runs, warmup)
        rows.append({"profile": profile.to_dict(), "rates": rates})
        if echo is not None:
            echo(k + 1, count)
    return rows


def summary(rows, strategies) -> dict:
    """Per strategy: the geometric mean of its rate over the best other strategy's of each profile
    (``vs_best_peer``), the share of profiles at >= 0.97 of it and of ``fixed``, and its worst cases."""
    out = {}
    for s in strategies:
        peers = [max(v for k, v in r["rates"].items() if k != s) for r in rows]
        ratios = np.array([r["rates"][s] / p for r, p in zip(rows, peers)])
        fixed = np.array([r["rates"][s] / r["rates"]["fixed"] for r in rows]) if "fixed" in strategies else None
        worst = np.argsort(ratios)[:3]
        out[s] = {
            "geomean_vs_best_peer": float(np.exp(np.log(ratios).mean())),
            "share_at_0.97_of_best_peer": float((ratios >= 0.97).mean()),
            "share_at_0.97_of_fixed": None if fixed is None else float((fixed >= 0.97).mean()),
            "worst": [(rows[i]["profile"]["name"], round(float(ratios[i]), 3)) for i in worst],
        }
    return out


def timed(fn, *args, **kwargs):
    """``(result, seconds)`` of one call (for the CLI's report of how long the families took)."""
    t0 = time.perf_counter()
    return fn(*args, **kwargs), time.perf_counter() - t0
