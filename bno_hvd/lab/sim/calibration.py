"""Fit the simulator's :class:`~bno_hvd.lab.sim.machine.Machine` from REAL suite logs.

Reads each suite directory's ``suite.json`` and, per profile, ``bench.json`` (per strategy and
rank: mean batch, gap, compute, sync and sync CPU; the update time) and ``balanced-updates.jsonl``
(rank 0's compute time of every update). Three steps, each on the fit suites only:

1. compute, a start: ``fixed_cpu``, ``per_sample_cpu`` and ``cold`` by a grid search over every rank of
   every strategy of the profiles with constant limits, the log error between its measured gap +
   compute and the time :class:`~bno_hvd.lab.sim.cfs.Quota` gives its CPU at its limit (averaged
   over the period's phase);
2. all of them again, with the sync phase's ``sync_cpu``, ``network``, ``spin``, ``ring_spin``
   and ``wake``, by coordinate descent over simulated runs of the static splits (``equal``,
   ``fixed``) of every REAL profile: the log errors of the update time and of every rank's local
   time, sync time and sync CPU (a long period's budget carries over from update to update,
   which only the simulated run has);
3. ``noise``: 65 quantiles of one compute step's deviation from its interval's median, from the
   updates of the profiles without a quota (competing processes, EMULATED: no quantisation there).

Usage (what regenerates the committed calibration)::

    python -m bno_hvd.lab.sim.calibration SUITE_DIR [SUITE_DIR ...] --out bno_hvd/lab/sim/calibration.json
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

import numpy as np

from bno_hvd.common.atomic import write_json_atomic
from bno_hvd.lab.sim.cfs import Quota
from bno_hvd.lab.sim.engine import simulate
from bno_hvd.lab.sim.machine import Machine
from bno_hvd.lab.sim.realsuite import BY_NAME

FIT_STRATEGIES = ("equal", "fixed", "lbbsp", "balanced")  # static splits, one that follows ops, ours
PHASES = 16


def bench_rows(suite_dirs) -> list[tuple]:
    """``(profile, bench row)`` of every REAL or EMULATED profile the suites ran."""
    out = []
    for d in suite_dirs:
        with open(os.path.join(d, "suite.json")) as fh:
            names = [r["profile"] for r in json.load(fh) if "strategies" in r]
        for name in names:
            path = os.path.join(d, name, "bench.json")
            if name in BY_NAME and os.path.exists(path):
                with open(path) as fh:
                    out += [(BY_NAME[name], row) for row in json.load(fh)]
    return out


def _ranks(row) -> list[dict]:
    ranks = row["rank_breakdown"]
    return ranks if isinstance(ranks, list) else []


def compute_points(rows) -> np.ndarray:
    """``(limit, period, batch, local seconds)`` of every rank that kept one batch (> 0) all the
    run (its mean is its final batch), constant limits."""
    pts = []
    for p, row in rows:
        if p.kind != "REAL" or p.schedule or any(p.busy) or any(p.mates):
            continue
        final = row.get("final_batch_sizes") or []
        for r in _ranks(row):
            if r["batch"] >= 1 and len(final) == len(p.limits) and abs(r["batch"] - final[r["rank"]]) < 0.5:
                pts.append((p.limits[r["rank"]], p.period_ms / 1e3, r["batch"], r["gap"] + r["compute"]))
    return np.array(pts)


def fit_compute(pts: np.ndarray) -> tuple[float, float, float]:
    """``(fixed_cpu, per_sample_cpu, cold)`` minimising the squared log error of the local times."""
    limit, period, batch, local = (np.repeat(pts[:, k : k + 1], PHASES, axis=1) for k in range(4))
    phase = period * (np.arange(PHASES) + 0.5) / PHASES
    per_sample = np.linspace(0.2e-3, 0.8e-3, 61)[:, None, None]
    best = (np.inf, None)
    for fixed in np.linspace(0.0, 8e-3, 17):
        for cold in np.linspace(0.0, 2e-3, 11):
            shape = (per_sample.shape[0], *limit.shape)
            q = Quota(*(np.broadcast_to(x, shape).copy() for x in (limit, period, phase, np.ones(limit.shape))), cold)
            work = np.broadcast_to(fixed + per_sample * batch, shape)
            got = q.run(np.zeros(shape), work).mean(axis=2)
            err = (np.log(got / local[:, 0]) ** 2).sum(axis=1)
            k = int(np.argmin(err))
            if err[k] < best[0]:
                best = (err[k], (float(fixed), float(per_sample[k, 0, 0]), float(cold)))
    return best[1]


def sync_loss(machine: Machine, rows, updates: int = 50) -> float:
    """Log errors of the simulated runs' update time and every rank's local time (gap and
    compute), sync time and sync CPU (the last two weigh less: they follow from the others)."""
    loss = 0.0
    for k, (p, row) in enumerate(rows):
        run = simulate(p, machine, row["strategy"], updates, seed=k)
        loss += 2 * np.log(run.seconds[updates // 3 :].mean() / row["mean_weight_update_time"]) ** 2
        for r in _ranks(row):
            i, ms = r["rank"], 1e-3
            loss += 0.5 * np.log(run.ranks["local"][i] / (r["gap"] + r["compute"])) ** 2 if r["batch"] >= 1 else 0.0
            loss += 0.25 * np.log((run.ranks["sync"][i] + ms) / (r["sync"] + ms)) ** 2
            loss += 0.1 * np.log((run.ranks["cpu_sync"][i] + ms) / (r["cpu_sync"] + ms)) ** 2
    return float(loss)


GRID = {
    "fixed_cpu": np.linspace(0.0, 4e-3, 9),
    "per_sample_cpu": np.linspace(0.30e-3, 0.50e-3, 9),
    "cold": np.linspace(0.0, 1e-3, 6),
    "sync_cpu": np.linspace(2e-3, 8e-3, 7),
    "network": np.linspace(5e-3, 30e-3, 6),
    "spin": np.linspace(0.0, 0.2, 5),
    "ring_spin": np.linspace(0.0, 0.6, 7),
    "wake": np.linspace(0.0, 25e-3, 6),
    "busy_weight": np.linspace(0.2, 1.0, 5),
}


def fit_sync(machine: Machine, rows, sweeps: int = 2, echo=print) -> Machine:
    """Coordinate descent over :data:`GRID` on :func:`sync_loss`, over every strategy's run of
    the REAL profiles (each simulated with the strategy itself)."""
    rows = [(p, row) for p, row in rows if p.kind == "REAL" and row["strategy"] in FIT_STRATEGIES]
    for sweep in range(sweeps):
        for key, values in GRID.items():
            losses = [sync_loss(replace(machine, **{key: float(v)}), rows) for v in values]
            machine = replace(machine, **{key: float(values[int(np.argmin(losses))])})
            echo(f"sweep {sweep + 1}: {key} = {getattr(machine, key):.4g} (loss {min(losses):.3f})")
    return machine


def step_noise(suite_dirs, quantiles: int = 65) -> list[float]:
    """Quantiles of rank 0's compute time over its interval's median, minus 1, in the profiles
    without a CPU quota (no period quantises them)."""
    dev = []
    for d in suite_dirs:
        for name, p in BY_NAME.items():
            path = os.path.join(d, name, "balanced-updates.jsonl")
            if any(np.isfinite(p.limits)) or not os.path.exists(path):
                continue
            groups: dict[tuple, list[float]] = {}
            with open(path) as fh:
                for line in fh:
                    rec = json.loads(line)
                    if rec.get("compute_time") and rec["update"] >= 20:
                        groups.setdefault((rec["update"] // 10, tuple(rec["batch_sizes"])), []).append(
                            rec["compute_time"]
                        )
            for times in groups.values():
                if len(times) >= 5:
                    dev += list(np.array(times) / np.median(times) - 1.0)
    if not dev:
        return [0.0]
    return [round(float(x), 4) for x in np.quantile(dev, (np.arange(quantiles) + 0.5) / quantiles)]


def calibrate(suite_dirs, echo=print, fit_start: bool = False) -> Machine:
    """The machine fitted on ``suite_dirs`` (see the module doc)."""
    rows = bench_rows(suite_dirs)
    fixed, per_sample, cold = fit_compute(compute_points(rows)) if fit_start else (2e-3, 0.4e-3, 0.5e-3)
    echo(f"compute: fixed {fixed * 1e3:.2f} ms, per sample {per_sample * 1e3:.3f} ms, cold {cold * 1e3:.2f} ms (CPU)")
    control = [row["control_ms_per_rebalance"] / 1e3 for _, row in rows if row["strategy"] == "equal"]
    machine = Machine(
        fixed_cpu=fixed,
        per_sample_cpu=per_sample,
        sync_cpu=5e-3,
        network=10e-3,
        spin=0.0,
        ring_spin=0.2,
        wake=10e-3,
        rebalance=float(np.median(control)) if control else 0.0,
        cold=cold,
        noise=tuple(step_noise(suite_dirs)),
        fitted_on=tuple(os.path.basename(os.path.normpath(d)) for d in suite_dirs),
    )
    machine = fit_sync(machine, rows, echo=echo)
    m = machine
    return replace(
        m,
        pass_cpu=m.fixed_cpu,  # a micro-batch repeats the fixed cost of a pass (no cap in the suite: not fitted)
        per_token_cpu=m.per_sample_cpu / 64,  # text is not in the REAL suite: a 64-token sequence costs a sample
        per_square_cpu=m.per_sample_cpu / 64 / 512,  # attention: its n^2 term equals the n term at 512 tokens
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Fit the simulator's machine from REAL suite directories.")
    parser.add_argument("suite_dirs", nargs="+")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    machine = calibrate(args.suite_dirs)
    write_json_atomic(args.out, {"machine": machine.to_dict()})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
