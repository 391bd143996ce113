"""The torch engine beside the Horovod engine: ``bench --suite`` run with each, the same profiles.

Each suite directory holds one ``bench.json`` per profile (:mod:`bno_hvd.lab.profiles`). For
every profile and strategy, the ratio of samples/s (torch over Horovod) is taken per round (the
suites of one round ran one after the other), and the table shows its median over the rounds,
its lowest, and both engines' median samples/s. Pure arithmetic over the files; no MPI.

Usage::

    python -m bno_hvd.lab.engines results/engines/horovod-1,results/engines/horovod-2 \\
        results/engines/torch-1,results/engines/torch-2
"""

from __future__ import annotations

import json
import os
import statistics
import sys

__all__ = ["engine_rows", "engine_markdown"]


def read_suite(out_dir: str) -> dict[tuple[str, str], float]:
    """(profile, strategy) -> samples/s, from every ``<out_dir>/<profile>/bench.json``."""
    found = {}
    for profile in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, profile, "bench.json")
        if os.path.isfile(path):
            with open(path) as fh:
                for row in json.load(fh):
                    found[(profile, row["strategy"])] = float(row["samples_per_s"])
    return found


def engine_rows(horovod: list[dict], torch: list[dict]) -> list[dict]:
    """Per (profile, strategy) found in every round of both: the torch/Horovod ratios (pure).
    ``horovod[i]`` and ``torch[i]`` are round i's suites (:func:`read_suite`)."""
    if len(horovod) != len(torch) or not horovod:
        raise ValueError("give as many Horovod suites as torch suites, one pair per round")
    keys = sorted(set.intersection(*(set(s) for s in horovod + torch)))
    rows = []
    for profile, strategy in keys:
        ratios = [t[(profile, strategy)] / h[(profile, strategy)] for h, t in zip(horovod, torch)]
        rows.append(
            {
                "profile": profile,
                "strategy": strategy,
                "horovod": statistics.median(h[(profile, strategy)] for h in horovod),
                "torch": statistics.median(t[(profile, strategy)] for t in torch),
                "ratio": statistics.median(ratios),
                "lowest": min(ratios),
                "rounds": len(ratios),
            }
        )
    return rows


def engine_markdown(rows: list[dict]) -> str:
    lines = [
        "| profile | strategy | horovod samples/s | torch samples/s | torch/horovod (median) | lowest |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['profile']} | {r['strategy']} | {r['horovod']:.1f} | {r['torch']:.1f} | "
            f"{r['ratio']:.3f} | {r['lowest']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.exit("usage: python -m bno_hvd.lab.engines HOROVOD_DIR[,...] TORCH_DIR[,...]")
    horovod, torch = ([read_suite(d) for d in arg.split(",")] for arg in argv)
    sys.stdout.write(engine_markdown(engine_rows(horovod, torch)))


if __name__ == "__main__":
    main()
