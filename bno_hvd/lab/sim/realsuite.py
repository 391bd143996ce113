"""The REAL suite's profiles as the simulator sees them, and the validation table: for each
profile, every strategy's ratio to ``equal`` predicted by the simulator against the one a suite
measured (its ``suite.json``).

The profiles are those of :mod:`bno_hvd.lab.profiles` (4 ranks, global batch 128, 180 updates of
which 20 warm up, 8 rounds), written here without its confinement code: the simulator needs only
the limits, periods, busy processes and schedules. Usage::

    python -m bno_hvd.lab.sim.realsuite SUITE_DIR [--calibration FILE]
    python -m bno_hvd.lab.sim.realsuite SUITE_DIR --against OTHER_SUITE_DIR  # REAL against REAL
"""

from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np

from bno_hvd.lab.sim.engine import compare, ratio
from bno_hvd.lab.sim.machine import CALIBRATION, Machine, SimProfile

INF = math.inf
UPDATES, WARMUP, ROUNDS = 180, 20, 8
SLOW = (0.45, 0.45, 0.45, 0.15)


def _p(name, limits, period=10.0, hand=None, **kw):
    return SimProfile(name, list(limits), period, hand=list(hand or limits), global_batch=128, kind="REAL", **kw)


REAL = (
    _p("quota-own-10ms", SLOW),
    _p("outside-100ms", SLOW, 100.0),
    _p("outside-two-slow-20ms", (0.5, 0.5, 0.17, 0.17), 20.0),
    _p("outside-tiny-20ms", (0.45, 0.45, 0.45, 0.08), 20.0),
    _p("outside-levels-10ms", (0.45, 0.35, 0.25, 0.12)),
    _p("outside-equal-10ms", (0.45,) * 4, hand=(1, 1, 1, 1)),
    # ranks 0-2 share core 0; rank 3 shares core 1 with 5 busy processes
    _p("competing-process", (INF,) * 4, hand=(1 / 3, 1 / 3, 1 / 3, 1 / 6), busy=[0, 0, 0, 5], mates=[2, 2, 2, 0]),
    # the schedules at their place in 180 updates with 20 of warm-up (lab.profiles.scaled_schedule)
    _p(
        "quota-schedule",
        (0.45,) * 4,
        hand=(0.45, 0.45, 0.45, 0.285),
        schedule=[(60, [0.45, 0.45, 0.45, 0.12], [0] * 4), (140, [0.45] * 4, [0] * 4)],
    ),
    _p(
        "quota-tiny-lifted",
        (0.45, 0.45, 0.45, 0.06),
        hand=(0.45, 0.45, 0.45, 0.255),
        schedule=[(100, [0.45] * 4, [0] * 4)],
    ),
)
EMULATED = (
    SimProfile(
        "emulated-3-levels",
        [INF] * 4,
        speed=[1, 0.6, 0.6, 0.3],
        mates=[1] * 4,
        hand=[1, 0.6, 0.6, 0.3],
        global_batch=128,
        kind="EMULATED",
    ),
    SimProfile(
        "emulated-4-levels",
        [INF] * 4,
        speed=[1, 0.75, 0.5, 0.25],
        mates=[1] * 4,
        hand=[1, 0.75, 0.5, 0.25],
        global_batch=128,
        kind="EMULATED",
    ),
)
BY_NAME = {p.name: p for p in REAL + EMULATED}


def measured(suite_dir: str) -> dict:
    """``{profile: {strategy: ratio to equal}}`` from a suite's ``suite.json``."""
    with open(os.path.join(suite_dir, "suite.json")) as fh:
        rows = json.load(fh)
    return {
        r["profile"]: {s: v["vs_equal"][0] for s, v in r["strategies"].items() if v.get("vs_equal", [None])[0]}
        for r in rows
        if "strategies" in r
    }


def validate(suite_dir: str, machine: Machine, seeds: int = 3) -> list[dict]:
    """Per profile of the suite: every strategy's measured and predicted ratio to equal (the
    median over ``seeds`` simulated runs), and each side's winner."""
    rows = []
    for name, got in measured(suite_dir).items():
        if name not in BY_NAME:
            continue
        specs = list(got)
        runs = [compare(BY_NAME[name], machine, specs, UPDATES, WARMUP, ROUNDS, seed=100 * s) for s in range(seeds)]
        rows.append(_row(name, got, {s: float(np.median([ratio(r, s) for r in runs])) for s in specs}))
    return rows


def against(suite_dir: str, other_dir: str) -> list[dict]:
    """:func:`validate`'s rows with another REAL suite's ratios in place of the simulator's: how
    well one run of the suite predicts the next, the most a calibration can be expected to do."""
    rows, other = [], measured(other_dir)
    for name, got in measured(suite_dir).items():
        if name in BY_NAME and name in other:
            predicted = {s: v for s, v in other[name].items() if s in got}
            rows.append(_row(name, {s: v for s, v in got.items() if s in predicted}, predicted))
    return rows


def _row(name: str, got: dict, predicted: dict) -> dict:
    winner = [max(got, key=got.get), max(predicted, key=predicted.get)]
    return {"profile": name, "kind": BY_NAME[name].kind, "measured": got, "predicted": predicted, "winner": winner}


def ratio_errors(rows: list[dict]) -> np.ndarray:
    """Log errors of every predicted ratio to ``equal`` against the measured one (:func:`validate`'s rows)."""
    return np.array([np.log(r["predicted"][s] / m) for r in rows for s, m in r["measured"].items() if s != "equal"])


def table(rows: list[dict]) -> str:
    """The validation table in Markdown: predicted / measured per strategy, within +-15% marked."""
    specs = list(dict.fromkeys(s for r in rows for s in r["measured"] if s != "equal"))
    lines = ["| profile | " + " | ".join(specs) + " | winner measured / predicted |"]
    lines.append("|" + "---|" * (len(specs) + 2))
    inside = total = same = 0
    for r in rows:
        cells = []
        for s in specs:
            m, p = r["measured"].get(s), r["predicted"].get(s)
            if m is None:
                cells.append("")
                continue
            ok = abs(p / m - 1) <= 0.15
            inside, total = inside + ok, total + 1
            cells.append(f"{p:.2f} / {m:.2f}" + ("" if ok else " **x**"))
        same += r["winner"][0] == r["winner"][1]
        lines.append(f"| {r['profile']} | " + " | ".join(cells) + f" | {r['winner'][0]} / {r['winner'][1]} |")
    lines.append("")
    lines.append(
        f"predicted within +-15% of measured: {inside} of {total}; same winner on {same} of {len(rows)} profiles"
    )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="The simulator's predictions against a suite's measurements.")
    parser.add_argument("suite_dir")
    parser.add_argument("--calibration", default=CALIBRATION)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--against", metavar="OTHER_SUITE_DIR", help="predict with another suite's ratios instead")
    args = parser.parse_args(argv)
    if args.against:
        print(table(against(args.suite_dir, args.against)))
    else:
        print(table(validate(args.suite_dir, Machine.load(args.calibration), args.seeds)))


if __name__ == "__main__":
    main()
