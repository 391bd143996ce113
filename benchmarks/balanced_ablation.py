"""What each part of ``balanced`` is worth on random simulated profiles: the ablation table.

Each variant is ``balanced`` with one part taken out (a subclass, or an option), run with the
same profiles and noise as the peers (``equal``, ``lbbsp``, ``proportional`` and the hand split
``fixed``); a variant's rate is compared with the best *peer* of each profile, never with another
variant. Rates are cached per strategy in ``--out`` (one JSON file each), so a second run with
more variants reruns only those. ``--extra NAME=module:Class`` adds a strategy class importable
from ``PYTHONPATH`` (another version of ``balanced``, say) as one more variant.

    python benchmarks/balanced_ablation.py --profiles 1000 --seed 40 --out /tmp/ablation

``--calibration FILE`` runs it on another machine file (the cache in ``--out`` does not know
which: give each its own directory).
"""

import argparse
import importlib
import json
import os

import numpy as np

from bno_hvd.allocation.balanced import EqualFinishStrategy
from bno_hvd.lab.sim.engine import simulate
from bno_hvd.lab.sim.families import random_profile, run_seed
from bno_hvd.lab.sim.machine import Machine

PEERS = ("equal", "lbbsp", "proportional", "fixed")


class NoShape(EqualFinishStrategy):
    """Every rank fitted through the origin: no fixed cost (``k = 0``)."""

    def _fit(self, metrics, limits):
        self.shape = 0.0
        return super()._fit(metrics, limits)


class NoGroups(EqualFinishStrategy):
    """Every rank fitted alone, also where ranks report one CPU limit."""

    def _fit(self, metrics, limits):
        return super()._fit(metrics, np.full(self.n_ranks, np.inf))


class NoThrottle(EqualFinishStrategy):
    """No charge for a throttled rank's sync: equal compute finish."""

    def _offsets(self, metrics, out):
        return np.zeros(self.n_ranks)


class NoForget(EqualFinishStrategy):
    """A rank whose limit rose keeps the fit of its steps under the old limit."""

    def _rose(self, limits):
        self.limits = limits
        return []


class OneAtATime(EqualFinishStrategy):
    """At most one rank out at a time (the sit-out before several could leave together)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sitouts.most = 1


VARIANTS = {
    "balanced": "balanced",
    "no-shape": NoShape,
    "no-groups": NoGroups,
    "no-throttle": NoThrottle,
    "no-threshold": "balanced:deadband=0",
    "no-forget": NoForget,
    "no-sit-out": "balanced:sit_out=0",
    "one-at-a-time": OneAtATime,
    "no-trials": "balanced:starved_share=0",
    "no-remeasure": "balanced:sit_out=1000000",
}


def spec_for(variant, profile, seed):
    """What :func:`simulate` takes: a spec string, or the class built for this profile."""
    if isinstance(variant, str):
        return variant
    n, g = profile.n, profile.global_batch
    strategy = variant(n, max(g // n, 1), global_batch=g, seed=seed)
    strategy.sit_out_ok = True
    return strategy


def rates_of(name, variant, machine, args) -> list[float]:
    """Samples/s after the warm-up on every profile (cached in ``--out``)."""
    path = os.path.join(args.out, f"{name}-{args.seed}-{args.profiles}-{args.updates}.json")
    if os.path.exists(path):
        return json.load(open(path))
    rng, out = np.random.default_rng(args.seed), []
    for k in range(args.profiles):
        profile = random_profile(rng, f"random-{args.seed}-{k}", args.updates)
        seed = run_seed(args.seed, k)  # as bno-hvd simulate: the same noise for every strategy
        run = simulate(profile, machine, spec_for(variant, profile, seed), args.updates, seed=seed)
        out.append(float(run.samples[20:].sum() / run.seconds[20:].sum()))
    json.dump(out, open(path, "w"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profiles", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--updates", type=int, default=120)
    parser.add_argument("--out", required=True)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--extra", action="append", default=[], help="NAME=module:Class, one more variant")
    parser.add_argument("--calibration", help="the simulator's machine file (default: the committed one; a new --out)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    variants = {v: VARIANTS[v] for v in args.variants.split(",") if v}
    for item in args.extra:
        name, _, where = item.partition("=")
        module, _, cls = where.partition(":")
        variants[name] = getattr(importlib.import_module(module), cls)
    machine = Machine.load(args.calibration) if args.calibration else Machine.load()
    peers = np.array([rates_of(p, p, machine, args) for p in PEERS])
    best, fixed = peers.max(axis=0), peers[PEERS.index("fixed")]
    print(f"{args.profiles} profiles, seed {args.seed}; each against the best of {', '.join(PEERS)}")
    print(f"{'variant':<16} {'geomean vs best peer':>21} {'>= 0.97x peer':>14} {'>= 0.97x fixed':>15}  worst")
    for name, variant in variants.items():
        mine = np.array(rates_of(name, variant, machine, args))
        ratio = mine / best
        worst = ", ".join(f"random-{args.seed}-{i} {ratio[i]:.2f}" for i in np.argsort(ratio)[:3])
        print(
            f"{name:<16} {np.exp(np.log(ratio).mean()):>21.3f} {(ratio >= 0.97).mean():>14.1%} "
            f"{(mine / fixed >= 0.97).mean():>15.1%}  {worst}"
        )


if __name__ == "__main__":
    main()
