"""Why ``balanced`` is below the best peer on a simulated profile: its split, or its run.

For every profile of a ``bno-hvd simulate`` run (its ``simulate.json``) where ``balanced`` is
below ``--below`` (0.97) of the best other strategy, both are run again with the same noise, the
split each held longest is kept fixed for a whole run (same noise again), and the two fixed runs
are compared:

* ``split``: ``balanced``'s own split kept fixed is below ``--below`` of the peer's kept fixed.
  The model chose a slower split (what it predicts is wrong there).
* ``run``: its split is as fast, but its run is slower: what it lost is in the run itself (the
  interval before its split, moves, trials and returns, a rebalance's pause shifting the phase
  of a long CFS period).

The profiles are drawn again from the seed in their names (``random-SEED-K``) and checked
against the parameters the file holds. Usage::

    python -m bno_hvd.lab.sim.misses DIR/simulate.json [--below 0.97] [--calibration FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import re

import numpy as np

from bno_hvd.lab.sim.engine import simulate
from bno_hvd.lab.sim.families import pooled_rate, random_profile, run_seed
from bno_hvd.lab.sim.machine import Machine

UPDATES, WARMUP = 120, 20  # as run_families runs them


def held_longest(splits) -> list[int]:
    """The split a run held for the most rebalance intervals (the first interval's, the starting
    split, not counted: every strategy begins there); ties: the earliest."""
    counts = collections.Counter(tuple(s) for s in splits[1:] or splits)
    return list(max(counts, key=lambda s: (counts[s], -[tuple(x) for x in splits].index(s))))


def explain(rows, machine: Machine, below: float = 0.97, strategy: str = "balanced") -> list[dict]:
    """One dict per profile of ``rows`` (``simulate.json``) where ``strategy`` is below ``below``
    of its best peer, worst first: the peer, both splits held longest, their rates kept fixed,
    and the ``kind`` of the miss (module doc)."""
    misses = []
    for k, row in enumerate(rows):
        rates = row["rates"]
        peer = max((s for s in rates if s != strategy), key=rates.get)
        if rates[strategy] < below * rates[peer]:
            misses.append((rates[strategy] / rates[peer], k, peer))
    profiles = _profiles(rows, max((k for _, k, _ in misses), default=-1) + 1)
    out = []
    for ratio, k, peer in sorted(misses):
        profile, noise = profiles[k], run_seed(*_seed_and_index(rows[k]))
        runs = {s: simulate(profile, machine, s, UPDATES, seed=noise) for s in (strategy, peer)}
        splits = {s: held_longest(r.splits) for s, r in runs.items()}
        fixed = {s: pooled_rate([simulate(profile, machine, splits[s], UPDATES, seed=noise)], WARMUP) for s in splits}
        own = fixed[strategy] / fixed[peer]
        out.append(
            {
                "profile": profile.name,
                "ratio": ratio,
                "peer": peer,
                "split": splits[strategy],
                "peer_split": splits[peer],
                "fixed_ratio": own,
                "run_of_fixed": pooled_rate([runs[strategy]], WARMUP) / fixed[strategy],
                "kind": "split" if own < below else "run",
            }
        )
    return out


def _seed_and_index(row) -> tuple[int, int]:
    match = re.fullmatch(r"random-(\d+)-(\d+)", row["profile"]["name"])
    if match is None:
        raise ValueError(f"{row['profile']['name']!r} is not a random profile (random-SEED-K)")
    return int(match[1]), int(match[2])


def _profiles(rows, count: int) -> list:
    """The first ``count`` profiles drawn again from their seed, each checked against its row."""
    if not rows or count <= 0:
        return []
    seed = _seed_and_index(rows[0])[0]
    rng, profiles = np.random.default_rng(seed), []
    for k in range(count):
        profile = random_profile(rng, f"random-{seed}-{k}", UPDATES)
        if json.loads(json.dumps(profile.to_dict())) != rows[k]["profile"]:
            raise ValueError(
                f"{profile.name} drawn again differs from the file's "
                "(another --updates than 120, or another version of the families?)"
            )
        profiles.append(profile)
    return profiles


def _short(split, most: int = 8) -> str:
    return ",".join(map(str, split[:most])) + (",…" if len(split) > most else "")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Why balanced is below the best peer: its split, or its run.")
    parser.add_argument("simulate_json")
    parser.add_argument("--below", type=float, default=0.97)
    parser.add_argument("--calibration", default=None, help="the simulator's machine file (default: the committed)")
    args = parser.parse_args(argv)
    with open(args.simulate_json) as f:
        rows = json.load(f)
    machine = Machine.load(*([args.calibration] if args.calibration else []))
    found = explain(rows, machine, args.below)
    print(
        "| profile | of the best peer | peer | split kept fixed / the peer's | run / its split fixed | kind | splits |"
    )
    print("|---|---|---|---|---|---|---|")
    for m in found:
        ratios = f"{m['ratio']:.3f} | {m['peer']} | {m['fixed_ratio']:.3f} | {m['run_of_fixed']:.3f}"
        print(f"| {m['profile']} | {ratios} | {m['kind']} | {_short(m['split'])} against {_short(m['peer_split'])} |")
    kinds = collections.Counter(m["kind"] for m in found)
    print(f"{len(found)} of {len(rows)} profiles below {args.below:g} of the best peer: {dict(kinds)}")


if __name__ == "__main__":
    main()
