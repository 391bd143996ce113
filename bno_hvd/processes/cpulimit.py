"""The CPU limit this process runs under, read from its cgroup (never set here).

A container's ``--cpus``, a Kubernetes CPU limit, Slurm's or systemd's ``CPUQuota`` and bno-hvd's
own ``--cpu-quota`` (:mod:`bno_hvd.lab.cpuquota`) all end as a CFS bandwidth limit on a cgroup the
process is in: cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, or v2's ``cpu.max``.
:func:`cpu_limit` reads the smallest on the way to the hierarchy's root; :class:`BindingLimit`
says whether that limit binds a rank (whether it runs into it), which is what the allocation
needs to know (:mod:`bno_hvd.allocation.offsets`).
"""

from __future__ import annotations

import os


def own_cgroups(mounts: str, own: str) -> dict[int, tuple[str, str | None]]:
    """Per cgroup version with a CPU controller mounted (v1's ``cpu`` hierarchy, v2's unified
    one): ``(mount point, this process's cgroup path in it)``; the path is None when
    ``/proc/self/cgroup`` has no line for it."""
    roots = {}
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup" and "cpu" in fields[3].split(","):
            roots[1] = fields[1]
        if len(fields) >= 3 and fields[2] == "cgroup2":
            roots.setdefault(2, fields[1])
    paths = dict(cgroup_line(line) for line in own.splitlines() if line.count(":") >= 2)
    found = {}
    if 1 in roots:
        found[1] = (roots[1], next((p for ctrls, p in paths.items() if "cpu" in ctrls.split(",")), None))
    if 2 in roots:
        found[2] = (roots[2], paths.get(""))
    return found


def cpu_limit(mounts: str | None = None, own: str | None = None) -> float | None:
    """This process's CPU limit in cores (a CFS quota over its period), or None when it has none.

    The smallest limit on the way from the process's own cgroup up to the hierarchy's root: a
    container's ``--cpus``, a Kubernetes CPU limit, Slurm's or systemd's ``CPUQuota``, or our own
    ``--cpu-quota``. cgroup v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``) and v2 (``cpu.max``).
    Read at every rebalance, so a quota that changes during the run is seen. Never raises: None
    when nothing can be read."""
    found = cpu_bandwidth(mounts, own)
    return None if found is None else found[0]


def cpu_bandwidth(mounts: str | None = None, own: str | None = None) -> tuple[float, float] | None:
    """``(limit in cores, its CFS period in seconds)`` of the smallest limit (:func:`cpu_limit`),
    or None. The period is how long a budget lasts: a rank that waits saves at most one."""
    try:
        mounts = mounts if mounts is not None else read_text("/proc/self/mounts")
        own = own if own is not None else read_text("/proc/self/cgroup")
    except OSError:
        return None
    found = own_cgroups(mounts, own)
    version = 1 if 1 in found else 2 if 2 in found else None
    if version is None or found[version][1] is None:
        return None
    root, path = found[version]
    limits = []
    parts = [p for p in path.strip("/").split("/") if p]
    for depth in range(len(parts), -1, -1):
        limit = _limit_in(os.path.join(root, *parts[:depth]), version)
        if limit is not None:
            limits.append(limit)
    return min(limits) if limits else None


def _limit_in(folder: str, version: int) -> tuple[float, float] | None:
    """``(cores, period in seconds)`` one cgroup directory sets, None for "max", -1 or an unreadable file."""
    try:
        if version == 1:
            quota = int(read_text(os.path.join(folder, "cpu.cfs_quota_us")).strip())
            period = int(read_text(os.path.join(folder, "cpu.cfs_period_us")).strip())
        else:
            text = read_text(os.path.join(folder, "cpu.max")).split()
            if not text or text[0] == "max":
                return None
            quota, period = int(text[0]), int(text[1])
    except (OSError, ValueError, IndexError):
        return None
    return (quota / period, period / 1e6) if quota > 0 and period > 0 else None


def cgroup_line(line: str) -> tuple[str, str]:
    _, controllers, path = line.split(":", 2)
    return controllers, path


def read_text(path: str, default: str | None = None) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        if default is None:
            raise
        return default


class BindingLimit:
    """This rank's CPU limit (cores) where it binds: the rank used at least half of it in its
    recent compute phases. A limit the rank does not run into (a GPU rank waiting on its device)
    says nothing about how fast it does its part of the allreduce. Its compute, not its whole
    update: a rank that waits for slower ones in the allreduce (asleep on Gloo) used less than
    half of its limit over the update while its compute ran into it (seen: four ranks at 0.2 of a
    core beside four out, fitted apart for 15 intervals because two of them read no limit).

    Once a limit has bound it counts until it changes: a throttled rank that ``balanced`` then
    gives a few samples waits for the others most of an update and uses less than half of it,
    and dropping the limit then would undo the split that made it wait (seen: rank 3 at 0.1 of a
    core moved from 1 to 11 samples and back).

    Usage::

        binding = BindingLimit()
        limit = binding.read(timer.compute_use)   # at every rebalance; None: none that binds
        binding.period                        # its CFS period in seconds (None: none that binds)
    """

    def __init__(self, read_limit=cpu_bandwidth):
        self.read_limit = read_limit  # () -> cores, (cores, CFS period in seconds) or None
        self.bound: float | None = None  # the limit this rank last ran into (kept while it stays)
        self.period: float | None = None  # its CFS period in seconds, where the reader knows it

    def read(self, cpu_use) -> float | None:
        """``cpu_use``: (CPU seconds, wall seconds) of recent compute phases."""
        found = self.read_limit()
        limit, period = found if isinstance(found, tuple) else (found, None)
        if limit is None or limit != self.bound:
            self.bound = None
        cpu, wall = (sum(x) for x in zip(*cpu_use)) if cpu_use else (0.0, 0.0)
        if limit is not None and wall > 0 and cpu / wall >= 0.5 * limit:
            self.bound = limit
        self.period = period if self.bound is not None else None
        return self.bound
