"""Do ranks with one CPU limit get one share? Read from ``balanced``'s updates in a suite directory.

Item 4 of the suite's targets: ranks with the same limit end within ±10% of each other's share
(no frozen noise). For each REAL profile whose ranks share a limit in every phase, this counts
the updates (from ``FROM_UPDATE`` on, after the first rebalances) in which every rank of such a
group that takes part is within ±10% of the group's mean share, or at most one sample from the
others (at 5 samples, ±10% is half a sample: rounding, not noise), and names the widest split
seen and the updates it held for, from the directory ``bno-hvd bench --suite real --out DIR`` wrote::

    python -m bno_hvd.lab.shares DIR
"""

from __future__ import annotations

import json
import os
import sys

from bno_hvd.lab.profiles import BY_NAME, Profile

FROM_UPDATE = 20  # the first two rebalance intervals: the split is still being measured
TOLERANCE = 0.10


def same_limit_groups(profile: Profile) -> list[list[int]]:
    """Groups of two or more ranks at one CPU limit in every phase of ``profile`` (none without limits)."""
    if profile.kind != "REAL":
        return []
    limits = profile.outside
    if profile.schedule:
        phases = [quotas for _, quotas in profile.schedule]
        limits = tuple(q if all(p[i] == q for p in phases) else None for i, q in enumerate(phases[0]))
    elif limits is None and profile.flags[:1] == ("--cpu-quota",):
        limits = tuple(float(x) for x in profile.flags[1].split(","))
    groups: dict[float, list[int]] = {}
    for rank, limit in enumerate(limits or ()):
        if limit is not None:
            groups.setdefault(limit, []).append(rank)
    return [g for g in groups.values() if len(g) > 1]


def even(sizes: list[int], groups: list[list[int]]) -> bool:
    """Whether every group's ranks that take part (more than 0 samples) got one share."""
    for group in groups:
        got = [sizes[i] for i in group if sizes[i] > 0]
        if len(got) < 2:
            continue
        mean = sum(got) / len(got)
        if max(abs(b / mean - 1) for b in got) > TOLERANCE and max(got) - min(got) > 1:
            return False
    return True


def profile_shares(updates: list[dict], groups: list[list[int]]) -> dict:
    """``{"even": k, "updates": n, "widest": ratio, "split": sizes, "first": u, "last": u, "held": m}``."""
    out = {"even": 0, "updates": 0, "widest": 1.0, "split": None, "first": None, "last": None, "held": 0}
    for row in updates:
        if row["update"] < FROM_UPDATE:
            continue
        sizes = row["batch_sizes"]
        out["updates"] += 1
        out["even"] += even(sizes, groups)
        ratios = [
            max(got) / min(got) for got in ([sizes[i] for i in g if sizes[i] > 0] for g in groups) if len(got) > 1
        ]
        ratio = max(ratios, default=1.0)
        if ratio > out["widest"] + 1e-9:
            out.update(widest=ratio, split=sizes, first=row["update"], last=row["update"], held=1)
        elif sizes == out["split"]:
            out.update(last=row["update"], held=out["held"] + 1)
    return out


def report(suite_dir: str) -> list[str]:
    """One line per REAL profile with same-limit ranks in ``suite_dir`` (``PROFILE/runs/balanced/updates.jsonl``)."""
    lines = []
    for name in sorted(os.listdir(suite_dir)):
        path = os.path.join(suite_dir, name, "runs", "balanced", "updates.jsonl")
        groups = same_limit_groups(BY_NAME[name]) if name in BY_NAME else []
        if not groups or not os.path.exists(path):
            continue
        with open(path) as fh:
            s = profile_shares([json.loads(line) for line in fh if line.strip()], groups)
        line = f"{name} (REAL): ranks {groups} at one limit: within ±10% in {s['even']}/{s['updates']} updates"
        if s["split"] is not None:
            line += f"; widest {s['widest']:.2f}: {s['split']} ({s['held']} updates from {s['first']} to {s['last']})"
        lines.append(line)
    return lines


if __name__ == "__main__":
    print("\n".join(report(sys.argv[1])))
