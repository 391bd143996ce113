"""A diagnostic, not a strategy: ``balanced`` with its throttle charge limited by the CFS period.

A rank that waits for the others saves at most one period's budget (``L * P`` CPU seconds, which
then run at a full core's speed), so arriving earlier than ``P * (1 - L)`` buys nothing: the rest
of its part of the allreduce starts when the last rank arrives. Here each rank's offset becomes
``max(s_i, D)``, ``D`` the largest ``s_j - P * (1 - L_j)`` over the ranks in (so a rank that sits
out still takes its whole part with it). A real job does not report its CFS period yet: the
strategy gets each profile's from the simulator. Results and what taking it would need:
docs/simulator.md ("A lead: the throttle charge beyond one period's budget").

    python benchmarks/period_charge.py --profiles 1000 --seed 40 --out DIR

prints ``balanced`` and this variant against the best peer, as ``balanced_ablation.py`` does (the
peers' and ``balanced``'s rates are cached in ``--out``, shared with that script).
"""

import argparse
import json
import os
import sys

import numpy as np

import bno_hvd.allocation.balanced as balanced
import bno_hvd.allocation.fitting as fitting
import bno_hvd.allocation.sitting as sitting
from bno_hvd.lab.sim.engine import simulate
from bno_hvd.lab.sim.families import random_profile
from bno_hvd.lab.sim.machine import Machine

sys.path.insert(0, os.path.dirname(__file__))
from balanced_ablation import PEERS, rates_of  # noqa: E402

OVER = {"by": None}  # s_j - P (1 - L_j) of the last rebalance (one strategy runs at a time)


def _with_term(model, inside):
    over = OVER["by"]
    if over is None:
        return model
    a, c, caps, offsets = model
    d = max(float(np.max(over[inside])), 0.0) if inside.any() else 0.0
    return a, c, caps, np.maximum(np.asarray(offsets), d)


def predicted_step(model, sizes):
    return fitting.predicted_step(_with_term(model, np.asarray(sizes) > 0), sizes)


def split_without(model, out, total):
    inside = np.ones(len(model[0]), dtype=bool)
    inside[[int(out)] if np.isscalar(out) else sorted(out)] = False
    return fitting.split_without(_with_term(model, inside), out, total)


def period_charged(period_s: float):
    class PeriodCharged(balanced.EqualFinishStrategy):
        def _offsets(self, metrics):
            measured = [x for x in metrics.sync_cpu if x is not None and np.isfinite(x) and x >= 0]
            if not measured:
                OVER["by"] = None
                return np.zeros(self.n_ranks)
            limits = np.array([x if x is not None and 0 < x < 1 else 1.0 for x in metrics.cpu_limit], dtype=float)
            need = min(measured) * (1.0 / limits - 1.0)
            OVER["by"] = need - period_s * (1.0 - limits)
            return need  # (absolute, as D is: a constant shift changes no split)

    return PeriodCharged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profiles", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--updates", type=int, default=120)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    machine = Machine.load()
    peers = np.array([rates_of(p, p, machine, args) for p in PEERS])
    ours = np.array(rates_of("balanced", "balanced", machine, args))
    path = os.path.join(args.out, f"period-charge-{args.seed}-{args.profiles}-{args.updates}.json")
    if not os.path.exists(path):
        sitting.predicted_step, sitting.split_without = predicted_step, split_without
        balanced.predicted_step, balanced.split_without = predicted_step, split_without
        rng, rates = np.random.default_rng(args.seed), []
        for k in range(args.profiles):
            profile = random_profile(rng, f"random-{args.seed}-{k}", args.updates)
            seed = args.seed * 100003 + k
            n, g = profile.n, profile.global_batch
            strategy = period_charged(profile.period_ms / 1e3)(n, max(g // n, 1), global_batch=g, seed=seed)
            strategy.sit_out_ok = True
            run = simulate(profile, machine, strategy, args.updates, seed=seed)
            rates.append(float(run.samples[20:].sum() / run.seconds[20:].sum()))
        with open(path, "w") as fh:
            json.dump(rates, fh)
    with open(path) as fh:
        variant = np.array(json.load(fh))
    best, fixed = peers.max(axis=0), peers[PEERS.index("fixed")]
    print(f"{args.profiles} profiles, seed {args.seed}; each against the best of {', '.join(PEERS)}")
    for name, mine in (("balanced", ours), ("period-charge", variant)):
        ratio = mine / best
        print(
            f"{name:<14} geomean vs best peer {np.exp(np.log(ratio).mean()):.3f}, >= 0.97x peer "
            f"{(ratio >= 0.97).mean():.1%}, >= 0.97x fixed {(mine / fixed >= 0.97).mean():.1%}"
        )
    per = variant / ours
    worst = f"random-{args.seed}-{int(per.argmin())} {per.min():.2f}"
    print(f"period-charge / balanced: {np.exp(np.log(per).mean()):.3f}; {(per > 1.03).sum()} profiles gain")
    print(f"more than 3%, {(per < 0.97).sum()} lose as much (worst {worst})")


if __name__ == "__main__":
    main()
