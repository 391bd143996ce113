"""REAL slow ranks: each rank in its own cgroup with a CFS bandwidth limit (a share of one core).

``--cpu-quota 0.5,0.5,0.5,0.17`` gives rank i ``quota_i`` CPU-seconds per second: every thread of
the rank (the model, Horovod's background loop, MPI's progress, the metrics monitor, DataLoader
workers, which are forked into the same cgroup) spends that one budget, as on a container with a
CPU limit or a node shared with a busy neighbour. Results of such runs are labelled "REAL:
CPU-throttled ranks (cgroup quota)" (:mod:`bno_hvd.lab.heterogeneity`), never "EMULATED".

Both cgroup versions: v1's ``cpu`` controller (``cpu.cfs_period_us`` / ``cpu.cfs_quota_us``, this
machine) and v2's ``cpu.max`` ("QUOTA PERIOD"). The group is made next to the rank's own cgroup
(v1: a child of it; v2: a sibling, since v2 allows no processes in a cgroup whose children have
controllers). The period is short (10 ms unless a small quota needs more: the kernel's minimum
quota is 1 ms), so that throttling is smooth at the scale of a training step.

Removal: the rank moves itself back and removes its cgroup when the run ends (also on an error).
A rank killed with SIGKILL cannot; for that a reaper process, started *before* the rank joins
the cgroup (so it stays outside it), waits for the rank's end (a pipe that closes when every
process of the rank has exited) and then removes the cgroup.

Usage::

    hook = CpuQuotaHook(RankSchedule.constant([0.5, 0.5, 0.5, 0.17]), rank)   # built by --cpu-quota
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import QUOTA, RankSchedule, load_rank_schedule, parse_float_list
from bno_hvd.processes.cpulimit import own_cgroups, read_text
from bno_hvd.training.hooks import Hook

MIN_QUOTA_US = 1000  # the kernel refuses smaller quotas
BASE_PERIOD_US = 10_000  # 10 ms: smooth at step scale (a 100 ms period throttles in long stalls)
MAX_PERIOD_US = 1_000_000  # the kernel's maximum period


def parse_quotas(text: str, n_ranks: int | None = None) -> list[float]:
    """``"0.5,0.5,0.5,0.17"`` -> one share of a core per rank, each within :data:`bno_hvd.common.parsing.QUOTA`."""
    return parse_float_list(text, "--cpu-quota", QUOTA, n_ranks, example="0.5,0.5,0.5,0.17")


def load_quota_schedule(path: str, n_ranks: int) -> RankSchedule:
    """``--cpu-quota-schedule FILE``: ``[{"update": 0, "quotas": [...]}, {"update": 150, ...}]``."""
    return load_rank_schedule(path, "--cpu-quota-schedule", "quotas", QUOTA, n_ranks)


def period_for(schedule: RankSchedule, period_ms: float | None = None) -> int:
    """Period (us) for every quota of ``schedule``: ``period_ms`` if given, else 10 ms or longer where
    the smallest quota needs it (the kernel's minimum quota is 1 ms); :class:`UsageError` if too short."""
    smallest = min(min(values) for _, values in schedule.entries)
    needed = int(-(-MIN_QUOTA_US // smallest))
    if period_ms is None:
        return int(min(MAX_PERIOD_US, max(BASE_PERIOD_US, needed)))
    period = int(round(period_ms * 1000))
    if period < needed:
        raise UsageError(
            f"--cpu-quota-period {period_ms:g} ms is too short for a quota of {smallest:g} (the kernel's "
            f"minimum quota is 1 ms): use at least {needed / 1000:g} ms"
        )
    return period


@dataclass(frozen=True)
class CgroupPlace:
    """Where this process's quota cgroup goes, and how to write its limit."""

    version: int  # 1 or 2
    home: str  # the process's own cgroup directory (to move back to)
    parent: str  # where the new cgroup is made


def find_place(mounts: str | None = None, own: str | None = None) -> CgroupPlace:
    """The cgroup this process can put itself into with a CPU limit; :class:`UsageError` if none."""
    mounts = mounts if mounts is not None else read_text("/proc/self/mounts")
    own = own if own is not None else read_text("/proc/self/cgroup")
    found = own_cgroups(mounts, own)
    if 1 in found:
        root, path = found[1]
        home = os.path.join(root, (path or "/").lstrip("/"))
        return _writable(CgroupPlace(1, home, home))
    if 2 in found and "cpu" in read_text(os.path.join(found[2][0], "cgroup.controllers"), "").split():
        root, path = found[2]
        home = os.path.join(root, (path or "/").lstrip("/"))
        parent = os.path.dirname(home.rstrip("/")) if os.path.realpath(home) != os.path.realpath(root) else home
        return _writable(CgroupPlace(2, home, parent))
    raise UsageError(
        "--cpu-quota needs a cgroup cpu controller: none is mounted here (cgroup v1 'cpu' or "
        "cgroup v2 with 'cpu' in cgroup.controllers); run without it or on a machine that has one"
    )


class CpuQuotaGroup:
    """One rank's cgroup with a CPU limit. ``join``/``leave`` move the whole process (all threads)."""

    def __init__(self, place: CgroupPlace, name: str, period_us: int):
        self.place, self.period_us = place, period_us
        self.path = os.path.join(place.parent, name)
        self.joined = False

    def create(self, quota: float) -> CpuQuotaGroup:
        try:
            os.mkdir(self.path)
            if self.place.version == 2:
                _write(os.path.join(self.place.parent, "cgroup.subtree_control"), "+cpu", check=False)
            self.set_quota(quota)
        except OSError as err:
            self.remove()
            raise UsageError(
                f"--cpu-quota: cannot make cgroup {self.path} ({err.strerror}); run as root or on a "
                "machine whose cgroups you may write"
            ) from None
        return self

    def set_quota(self, quota: float) -> None:
        quota_us = int(round(quota * self.period_us))  # >= MIN_QUOTA_US: checked by check_period
        if self.place.version == 1:
            _write(os.path.join(self.path, "cpu.cfs_period_us"), str(self.period_us))
            _write(os.path.join(self.path, "cpu.cfs_quota_us"), str(quota_us))
        else:
            _write(os.path.join(self.path, "cpu.max"), f"{quota_us} {self.period_us}")

    def join(self, pid: int | None = None) -> None:
        _write(os.path.join(self.path, "cgroup.procs"), str(pid or os.getpid()))
        self.joined = True

    def leave(self) -> None:
        """Move this process and whatever else is still in the group (its loader workers) back home."""
        for pid in [os.getpid()] + self.members():
            _write(os.path.join(self.place.home, "cgroup.procs"), str(pid), check=False)
        self.joined = False

    def members(self) -> list[int]:
        return [int(p) for p in read_text(os.path.join(self.path, "cgroup.procs"), "").split()]

    def throttled_seconds(self) -> float:
        """Time the group spent throttled so far (from cpu.stat)."""
        stat = dict(
            line.split()[:2]
            for line in read_text(os.path.join(self.path, "cpu.stat"), "").splitlines()
            if len(line.split()) >= 2
        )
        if "throttled_time" in stat:  # v1: nanoseconds
            return int(stat["throttled_time"]) / 1e9
        return int(stat.get("throttled_usec", 0)) / 1e6

    def remove(self) -> bool:
        """Remove the (empty) group; True when it is gone."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


class CpuQuotaHook(Hook):
    """``--cpu-quota``/``--cpu-quota-schedule``: this rank runs under its quota from the first update on."""

    groups_made = 0  # in this process

    def __init__(self, schedule: RankSchedule, rank: int, period_us: int | None = None, place=None):
        self.schedule, self.rank = schedule, rank
        self.period_us = period_us or period_for(schedule)
        self.place = place
        self.group: CpuQuotaGroup | None = None
        self._reaper: subprocess.Popen | None = None
        self._quota = None
        self._members: list[int] = []  # who was in the group when the run stepped aside

    def start(self, run) -> None:
        place = self.place or find_place()
        CpuQuotaHook.groups_made += 1  # a job may hold several runs (bench --rounds): one group each
        name = f"bno-hvd-{os.getpid()}-r{self.rank}-{CpuQuotaHook.groups_made}"
        self.group = CpuQuotaGroup(place, name, self.period_us)
        self._quota = self.schedule.at(0)[self.rank]
        try:
            self.group.create(self._quota)
        except UsageError as err:  # this host only: the rank says so and the job ends
            self.group = None
            raise UsageError(str(err), rank=self.rank) from None
        self._reaper = start_reaper(self.group.path)
        self.group.join()

    def before_compute(self, step) -> None:
        quota = self.schedule.at(step.update)[self.rank]
        if quota != self._quota:  # a neighbour arrives or leaves
            self.group.set_quota(quota)
            self._quota = quota

    def suspend(self) -> None:
        if self.group is not None and self.group.joined:
            self._members = self.group.members()  # the rank and its loader workers
            self.group.leave()

    def resume(self) -> None:
        if self.group is not None and not self.group.joined:
            for pid in self._members or [os.getpid()]:
                if pid != os.getpid():
                    _write(os.path.join(self.group.path, "cgroup.procs"), str(pid), check=False)  # gone: fine
            self.group.join()

    def finish(self, comm) -> list[str]:
        throttled = comm.gather(self.group.throttled_seconds() if self.group else 0.0, root=0)
        if throttled is not None and max(throttled) <= 0:
            return ["--cpu-quota: no rank was ever throttled; the quotas did not bind (more cores than ranks?)"]
        return []

    def close(self) -> None:
        if self.group is None:
            return
        self.group.leave()
        for _ in range(50):  # a member may still be on its way out
            if self.group.remove():
                break
            self.group.leave()
            time.sleep(0.1)
        if self._reaper is not None:
            end_reaper(self._reaper)
        self.group = None


def start_reaper(path: str) -> subprocess.Popen:
    """A process outside the cgroup that removes ``path`` once every process holding the pipe has ended."""
    return subprocess.Popen(
        [sys.executable, "-m", "bno_hvd.lab.cpuquota", "reap", path],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def end_reaper(reaper: subprocess.Popen, timeout: float = 5.0) -> None:
    """Close the reaper's pipe (it removes what is left and exits) and wait for it: a reaper left
    unwaited warns (ResourceWarning) in whatever test or run collects it. One still busy after
    ``timeout`` (a member lingers) goes on by itself, in its own session."""
    try:
        reaper.stdin.close()
        reaper.wait(timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        pass


def reap(path: str, stdin=sys.stdin.buffer, timeout: float = 60.0) -> int:
    """Wait for EOF on stdin (the rank and its children are gone), then remove the empty cgroup."""
    try:
        while stdin.read(1 << 12):
            pass
    except OSError:
        pass
    deadline = time.monotonic() + timeout
    while os.path.isdir(path) and time.monotonic() < deadline:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            break
        except OSError:  # a member is still exiting
            time.sleep(0.1)
    return 0 if not os.path.isdir(path) else 1


def _writable(place: CgroupPlace) -> CgroupPlace:
    probe = os.path.join(place.parent, f"bno-hvd-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError as err:
        raise UsageError(
            f"--cpu-quota: cannot make a cgroup in {place.parent} ({err.strerror}); run as root "
            "or on a machine whose cgroups you may write"
        ) from None
    os.rmdir(probe)
    return place


def _write(path: str, text: str, check: bool = True) -> None:
    try:
        with open(path, "w") as fh:
            fh.write(text)
    except OSError:
        if check:
            raise


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "reap":
    sys.exit(reap(sys.argv[2]))
