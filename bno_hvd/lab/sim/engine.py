"""The simulated update: every rank's compute, its wait and the allreduce, measured as a real job
measures them and fed to an unmodified :class:`~bno_hvd.allocation.Strategy`.

Each update, rank i with ``b_i > 0`` samples needs ``fixed_cpu + per_sample_cpu * b_i`` CPU
seconds (times a noise factor drawn from recorded steps) under its CFS limit and share of a core
(:class:`~bno_hvd.lab.sim.cfs.Quota`); an EMULATED rank then sleeps as if slower. Ranks arrive at
the allreduce in that order; while they wait they burn ``spin`` of the CPU; once the last is in,
each pays ``sync_cpu`` at its own limit (with the budget it has left), a rank among busy
processes waits for the scheduler, and the allreduce ends on all ranks together. Each then takes
its optimizer step (``step_cpu``) at its own limit and starts its next step when that is done:
no other rank waits for it, except at a rebalance. A rank with 0 samples sits the update out.
Every ``every`` updates rank 0's strategy gets what
:class:`~bno_hvd.allocation.ClusterMetrics` holds in a real job: each rank's last ``window``
(batch, gap + compute), (update, sync), sync CPU, whole-update times, its CPU limit where it binds
(its compute used at least half of it), its CPU share (run over runnable time) and CPU per wall second.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from bno_hvd.allocation import ClusterMetrics, make_strategy
from bno_hvd.lab.sim.cfs import Quota
from bno_hvd.lab.sim.machine import Machine, SimProfile


@dataclass
class SimRun:
    """One strategy's simulated run: per update its duration (s) and global batch, and the splits."""

    seconds: np.ndarray
    samples: np.ndarray
    splits: list
    ranks: dict  # per rank, the mean over the updates it took part in: "local", "sync", "cpu_sync" (s)

    def rates(self, warmup: int, rounds: int) -> list[float]:
        """Samples/s of each of ``rounds`` equal blocks of the updates after ``warmup``."""
        blocks = np.array_split(np.arange(warmup, self.seconds.size), rounds)
        return [float(self.samples[b].sum() / self.seconds[b].sum()) for b in blocks if b.size]


class Windows:
    """Each rank's recent measurements, as its StepTimer keeps them: the last ``window`` updates it
    took part in since it last came back. Stored update-major, one row per update (fast to add)."""

    FIELDS = ("batch", "local", "sync", "sync_cpu", "cpu", "wall", "runnable", "compute_cpu")

    def __init__(self, n: int, window: int, updates: int, period: float = 0.01):
        self.n, self.window, self.period = n, window, period
        self.rows = np.zeros((len(self.FIELDS), updates, n))
        self.took_part = np.zeros((updates, n), bool)
        self.bound = [None] * n  # the limit each rank last ran into (BindingLimit)

    def forget(self, mask) -> None:
        """Ranks back after sitting out: what they measured before is old."""
        self.took_part[:, mask] = False

    def add(self, u: int, inside, values) -> None:
        self.rows[:, u] = values
        self.took_part[u] = inside

    def metrics(self, u: int, limits, caps) -> ClusterMetrics:
        """What rank 0 gathers at a rebalance after update ``u - 1``."""
        part = self.took_part[:u]
        recent = part & (np.cumsum(part[::-1], axis=0)[::-1] <= self.window)
        batch, local, sync, sync_cpu, cpu, wall, runnable, compute_cpu = self.rows[:, :u]
        count = recent.sum(axis=0)
        tot = {
            k: np.where(recent, v, 0.0).sum(axis=0)
            for k, v in (("b", batch), ("t", local), ("cpu", cpu), ("wall", wall), ("ccpu", compute_cpu))
        }
        ran_all = np.where(recent, runnable, 0.0).sum(axis=0)
        limit_seen, share, per_wall, med, steps, syncs, cycles, ops = [], [], [], [], [], [], [], []
        updates = np.arange(u)
        for i in range(self.n):
            rows = recent[:, i]
            steps.append(list(zip(batch[rows, i].astype(int).tolist(), local[rows, i].tolist())))
            us = updates[rows].tolist()
            syncs.append(list(zip(us, sync[rows, i].tolist())))
            cycles.append(list(zip(us, wall[rows, i].tolist())))
            ops.append(tot["b"][i] / tot["t"][i] if count[i] else None)
            limit = None if not np.isfinite(limits[i]) else float(limits[i])
            if limit is None or limit != self.bound[i]:
                self.bound[i] = None
            if limit is not None and tot["t"][i] > 0 and tot["ccpu"][i] / tot["t"][i] >= 0.5 * limit:
                self.bound[i] = limit
            limit_seen.append(self.bound[i])
            share.append(float(tot["cpu"][i] / ran_all[i]) if count[i] and ran_all[i] > 0 else None)
            per_wall.append(float(tot["cpu"][i] / tot["wall"][i]) if count[i] else None)
            med.append(statistics.median(sync_cpu[rows, i].tolist()) if count[i] else None)
        return ClusterMetrics(
            ops=ops,
            memory_used=[1e9] * self.n,
            latency=np.zeros((self.n, self.n)),
            compute_samples=steps,
            max_batch=[int(c) if c > 0 else None for c in caps],
            sync_samples=syncs,
            sync_cpu=med,
            cpu_limit=limit_seen,
            cpu_period=[None if x is None else self.period for x in limit_seen],
            cycle_samples=cycles,
            cpu_share=share,
            cpu_per_wall=per_wall,
        )


def build_strategy(spec: str, profile: SimProfile, seed: int = 0):
    """The strategy of ``spec`` for ``profile``, as bench builds it (``fixed``: the hand split;
    every rank but 0 may sit out, as in bno-hvd's own loop)."""
    n, g = profile.n, profile.global_batch
    if spec == "fixed":
        strategy = make_strategy("fixed", n, max(g // n, 1), batch_sizes=profile.hand_split(), seed=seed)
    else:
        strategy = make_strategy(spec, n, max(g // n, 1), global_batch=g, seed=seed)
    strategy.sit_out_ok = True
    return strategy


def work_of(machine: Machine, profile: SimProfile, sizes: np.ndarray, rng) -> np.ndarray:
    """CPU seconds of each rank's step at ``sizes`` (before noise): fixed, per sample or per token,
    and the extra passes of a memory cap."""
    if profile.text is None:
        per = machine.per_sample_cpu * sizes
    else:  # a batch of b sequences: the sum of b lengths' costs, drawn from a lognormal
        mean, spread = profile.text
        s2 = np.log1p(spread**2)
        mu = np.log(mean) - s2 / 2
        m1, m2 = np.exp(mu + s2 / 2), np.exp(2 * mu + 2 * s2)  # E[n], E[n^2]
        one = machine.per_token_cpu * m1 + machine.per_square_cpu * m2
        sd = machine.per_token_cpu * m1 * spread + machine.per_square_cpu * m2 * np.sqrt(np.expm1(4 * s2))
        per = np.maximum(one * sizes + sd * np.sqrt(sizes) * rng.standard_normal(sizes.size), 0.0)
    caps = np.asarray(profile.caps, float)
    passes = np.where(caps > 0, np.ceil(sizes / np.where(caps > 0, caps, 1.0)), 1.0)
    return machine.fixed_cpu + per + machine.pass_cpu * np.maximum(passes - 1, 0)


def usable(limits, tax: float) -> np.ndarray:
    """What of each CPU limit is left to a rank's compute and allreduce: its other threads (Horovod's
    background loop, waking every cycle) take ``tax`` CPU s per wall s of the quota, or half of it
    when the limit is lower than twice that (the scheduler splits a quota fairly between the two)."""
    limits = np.asarray(limits, float)
    return np.where(np.isfinite(limits), np.maximum(limits - tax, limits / 2), limits)


def simulate(
    profile: SimProfile, machine: Machine, spec, updates: int, seed: int = 0, every: int = 10, window: int = 20
):
    """Run ``spec`` for ``updates`` updates on ``profile``; returns a :class:`SimRun`. ``spec``: a
    strategy's name (with options), a built :class:`~bno_hvd.allocation.Strategy` (its
    ``sit_out_ok`` as set), or a split of N ints kept all the run (0: that rank sits out)."""
    rng = np.random.default_rng(seed)
    n = profile.n
    noise = np.asarray(machine.noise, float)
    period = np.full(n, profile.period_ms / 1e3)
    quota = Quota(
        usable(profile.limits, machine.tax),
        period,
        rng.uniform(0, period),
        profile.share(None, machine.busy_weight),
        machine.cold,
    )
    limits, schedule = np.array(profile.limits, float), {int(u): (lim, b) for u, lim, b in profile.schedule}
    strategy = build_strategy(spec, profile, seed) if isinstance(spec, str) else spec
    sizes = np.array(strategy.initial() if hasattr(strategy, "rebalance") else spec)
    windows = Windows(n, window, updates, profile.period_ms / 1e3)
    busy = np.asarray(profile.busy, float)
    speed = np.asarray(profile.speed, float)
    seconds, samples, splits = np.zeros(updates), np.zeros(updates), [sizes.tolist()]
    sums, count = np.zeros((3, n)), np.zeros(n)
    t = 0.0  # the end of the last allreduce
    start = np.zeros(n)  # when each rank's next step begins: after its own optimizer step
    for u in range(updates):
        if u in schedule:
            limits, busy = np.array(schedule[u][0], float), np.asarray(schedule[u][1], float)
            quota.set(usable(limits, machine.tax), profile.share(busy, machine.busy_weight))
        inside = sizes > 0
        factor = 1.0 + noise[rng.integers(noise.size, size=n)]
        sync_cpu = machine.sync_cpu if inside.sum() > 1 else 0.0  # a process set of one has nothing to reduce
        early = machine.overlap * sync_cpu  # reduced during the backward pass, as gradients come out
        work = work_of(machine, profile, sizes.astype(float), rng) * np.maximum(factor, 0.1) + early
        done = quota.run(start, work, inside)
        done = start + (done - start) / speed  # an EMULATED rank waits as if slower (asleep)
        last = done[inside].max()
        spun = quota.spin(done, np.full(n, last), machine.spin, inside)
        part = quota.run(np.full(n, last), np.full(n, sync_cpu - early), inside) + machine.wake * busy * (sync_cpu > 0)
        k = inside.sum()  # a ring moves 2 (k - 1) / k of the gradients through every rank (1.5 at 4 ranks)
        end = max(part[inside].max(), last + machine.network * (2 * (k - 1) / k) / 1.5)
        spun = spun + quota.spin(part, np.full(n, end), machine.ring_spin, inside)  # polls for the ring
        # then each rank's optimizer step, at its own limit: no other rank waits for it
        stepped = np.where(inside, quota.run(np.full(n, end), np.full(n, machine.step_cpu), inside), end)
        cpu = work + spun + sync_cpu - early + machine.step_cpu
        runnable = np.maximum((done - start) * speed + (part - last) + spun + (stepped - end), cpu)
        in_sync = spun + sync_cpu - early + machine.step_cpu  # the CPU of its sync phase
        wall = stepped - start
        # the CPU of its compute phase, its other threads' (the tax) included, as a process's CPU time counts them
        limited = np.where(np.isfinite(limits), limits, 0.0)
        taxed = (limited - usable(limited, machine.tax)) * (done - start)
        windows.add(u, inside, [sizes, done - start, stepped - done, in_sync, cpu, wall, runnable, work + taxed])
        sums += np.where(inside, [done - start, stepped - done, in_sync], 0.0)
        count += inside
        seconds[u], samples[u] = end - t, sizes.sum()
        t, start = end, stepped
        if (u + 1) % every == 0 and u + 1 < updates and hasattr(strategy, "rebalance"):
            new = np.array(strategy.rebalance(windows.metrics(u + 1, limits, profile.caps), sizes.tolist(), u + 1))
            back = (sizes == 0) & (new > 0)
            windows.forget(back)
            # every rank meets rank 0 to rebalance; one coming back is sent its state (the process sets change)
            start = np.full(n, stepped.max() + machine.rebalance + machine.rejoin * back.any())
            sizes = new
            splits.append(sizes.tolist())
    means = sums / np.maximum(count, 1)
    return SimRun(seconds, samples, splits, dict(zip(("local", "sync", "cpu_sync"), means)))


def compare(profile: SimProfile, machine: Machine, specs, updates=180, warmup=20, rounds=8, seed=0) -> dict:
    """Every strategy's per-round rates on ``profile`` (each its own run, like bench's rounds)."""
    return {s: simulate(profile, machine, s, updates, seed + k).rates(warmup, rounds) for k, s in enumerate(specs)}


def ratio(rates: dict, name: str, base: str = "equal") -> float:
    """The median over rounds of ``name``'s rate over ``base``'s (bench's paired ratio)."""
    return float(np.median(np.array(rates[name]) / np.array(rates[base])))
