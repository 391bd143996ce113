"""The REAL elastic profile (``benchmarks/elastic_real.py``): a slow rank leaves, a fast one joins.

One ``bno-hvd elastic`` job per strategy, its workers held by REAL cgroup v1 CPU limits set
outside bno-hvd (:class:`~bno_hvd.lab.profiles.Confinement`: a cgroup per worker, 10 ms period,
removed when the job ends, also when it fails; a reaper removes them if the benchmark is killed).
The agent starts the workers itself, so the benchmark moves each one into its worker id's cgroup
as soon as its PID appears among the agent's children (:class:`Mover`): it runs unconfined for
that moment (about 10 ms, the poll, before its imports). At a fixed update (counted in the
ledger's commits) the slow worker gets SIGTERM and leaves at an update boundary; a few updates
later SIGUSR1 to the agent adds a worker, in a 0.45 cgroup.

Throughput over the run: the samples committed after the warm-up over the seconds between the
first commit after the warm-up and the last one, from ``ledger.jsonl``'s commit clocks
(:func:`throughput`).
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from bno_hvd.lab.profiles import Confinement, Profile
from bno_hvd.processes.membership import ID_ENV
from bno_hvd.processes.mpienv import mpi_env
from bno_hvd.training.ledger import FILE, committed_entries

STRATEGIES = ("balanced", "equal", "proportional", "lbbsp", "paramhub")  # random is not a contender
LIMITS = (0.45, 0.45, 0.45, 0.15)  # the first four workers; worker 3 is the slow one that leaves
JOINER = 0.45  # the worker SIGUSR1 adds (worker id 4)
PROFILE = Profile(
    "elastic-leave-join",
    "REAL",
    "limits 0.45,0.45,0.45,0.15 set outside, period 10 ms; the 0.15 worker leaves, a 0.45 one joins",
    LIMITS + (JOINER,),
    outside=LIMITS + (JOINER,),  # one cgroup per worker id, the joiner's made before the job too
    period_ms=10.0,
)


@dataclass(frozen=True)
class Schedule:
    """Updates of one job: ``warmup`` untimed, the slow worker asked to leave once ``leave_at``
    updates are committed, a join asked for once ``join_at`` are, ``updates`` in all."""

    updates: int = 540  # about 70 s a job here (2 rounds of 5 strategies: under 15 minutes)
    warmup: int = 30
    leave_at: int = 130
    join_at: int = 140

    def __post_init__(self):
        if not 0 < self.warmup < self.leave_at < self.join_at < self.updates:
            raise ValueError(f"need 0 < warmup < leave_at < join_at < updates, got {self}")

    def due(self, committed: int, left: bool, asked: bool) -> str | None:
        """What to do now that ``committed`` updates are committed: ``"leave"``, ``"join"`` or None."""
        if not left and committed >= self.leave_at:
            return "leave"
        if left and not asked and committed >= self.join_at:
            return "join"
        return None


def rotated(names, round_: int) -> list[str]:
    """Round ``round_``'s order: ``names`` rotated left by the round's number."""
    names = list(names)
    k = round_ % len(names)
    return names[k:] + names[:k]


def read_entries(log_dir: str) -> list[dict]:
    """The ledger's committed entries so far (a line being written is left out), one per update
    (the last written, as a rewrite after a rank 0 change keeps), in update order."""
    by_update = {entry["update"]: entry for entry in committed_entries(log_dir)}
    return [by_update[u] for u in sorted(by_update)]


def throughput(entries: list[dict], warmup: int) -> float:
    """Samples/s after ``warmup`` updates: the samples of the updates committed after the first
    timed commit, over the seconds from that commit to the last one (NaN: fewer than two)."""
    timed = [e for e in entries if e["update"] >= warmup]
    if len(timed) < 2:
        return math.nan  # a job that failed before it had anything to time
    seconds = timed[-1]["at"] - timed[0]["at"]
    return sum(sum(e["sizes"]) for e in timed[1:]) / seconds


def phases(entries: list[dict]) -> list[dict]:
    """The run cut where its members change: per phase its workers, updates, median update
    seconds, the first split and the last (what the strategy settled on)."""
    out: list[dict] = []
    for entry in entries:
        if not out or out[-1]["members"] != entry["members"]:
            out.append({"members": entry["members"], "entries": []})
        out[-1]["entries"].append(entry)
    for phase in out:
        got = phase.pop("entries")
        gaps = [b["at"] - a["at"] for a, b in zip(got, got[1:])]
        phase.update(
            first_update=got[0]["update"],
            updates=len(got),
            update_s=statistics.median(gaps) if gaps else None,
            first_split=got[0]["sizes"],
            last_split=got[-1]["sizes"],
            settled_after=_settled_after(got),
        )
    return out


def _settled_after(got: list[dict]) -> int:
    """Updates of a phase before its last split change (how long the strategy took to settle)."""
    changes = [i for i, (a, b) in enumerate(zip(got, got[1:]), 1) if a["sizes"] != b["sizes"]]
    return changes[-1] if changes else 0


class Mover:
    """Moves each worker of an elastic agent into its worker id's cgroup once its PID appears."""

    def __init__(self, groups: list):
        self.groups = groups  # CpuQuotaGroup per worker id
        self.moved: dict[int, int] = {}  # worker id -> pid

    def poll(self, agent_pid: int) -> list[int]:
        """Move the agent's new workers; the worker ids moved now."""
        import psutil

        now = []
        try:
            children = psutil.Process(agent_pid).children()
        except psutil.NoSuchProcess:
            return now
        for child in children:
            try:
                wid = int(child.environ()[ID_ENV])
            except (psutil.Error, KeyError, ValueError):
                continue  # gone, or not a worker yet (environ is read once it exec'd)
            if wid in self.moved or wid >= len(self.groups):
                continue
            try:
                self.groups[wid].join(child.pid)
            except OSError:
                continue  # it ended meanwhile
            self.moved[wid] = child.pid
            now.append(wid)
        return now


POLL_S = 0.02  # how often the driver looks at the ledger and the agent's children
SLOW_WORKER, FIRST = 3, 4  # the worker that leaves; workers at the start


@dataclass(frozen=True)
class Job:
    """One strategy's job: its schedule, data, log folder and the seconds it may take."""

    strategy: str
    schedule: Schedule
    data_dir: str
    log: str
    timeout: float = 300.0

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "bno_hvd", "elastic", "-n", str(FIRST), "--max-ranks", str(FIRST + 1),
            "--timeout", str(self.timeout), "--", "train", "--engine", "torch", "--elastic",
            "--global-batch", "64", "--strategy", self.strategy, "--updates", str(self.schedule.updates),
            "--data-dir", self.data_dir, "--no-eval", "--no-progress", "--latency-interval", "0",
            "--log-dir", self.log,
        ]  # fmt: skip


def committed(log: str) -> int:
    """Updates committed so far: the ledger's lines after its header (a cheap count, polled often)."""
    try:
        with open(os.path.join(log, FILE), "rb") as fh:
            return max(fh.read().count(b"\n") - 1, 0)
    except FileNotFoundError:
        return 0


def stop(proc: subprocess.Popen) -> None:
    """End the agent and its workers (they would hold the cgroups) if still running."""
    import psutil

    if proc.poll() is not None:
        return
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            pass
    proc.kill()
    proc.wait()
    psutil.wait_procs(children, timeout=30)  # out of their cgroups before these are removed


def drive(proc, mover: Mover, job: Job, events: dict) -> None:
    """Move new workers into their cgroups, and send the leave and the join when due (wall
    clocks into ``events``); :class:`TimeoutError` past ``job.timeout``."""
    left = asked = False
    end = time.monotonic() + job.timeout
    while proc.poll() is None:
        if len(mover.moved) < FIRST + asked:
            mover.poll(proc.pid)
            if asked and FIRST in mover.moved and "joiner_moved" not in events:
                events["joiner_moved"] = time.time()
        action = job.schedule.due(committed(job.log), left, asked)
        if action == "leave":
            os.kill(mover.moved[SLOW_WORKER], signal.SIGTERM)
            left, events["leave"] = True, time.time()
        elif action == "join":
            proc.send_signal(signal.SIGUSR1)
            asked, events["join"] = True, time.time()
        if time.monotonic() > end:
            raise TimeoutError(f"the job did not end within {job.timeout:g} s")
        time.sleep(POLL_S)


def run_job(job: Job, events: dict | None = None) -> dict:
    """Run ``job`` in its cgroups (removed again however it ends); its row. ``events``: filled
    as it runs (also when it raises)."""
    events = {} if events is None else events
    confinement = Confinement(PROFILE)
    with confinement, open(job.log + ".stderr", "w") as err:
        env = mpi_env(extra={"OMP_NUM_THREADS": "1"})
        proc = subprocess.Popen(job.command(), env=env, stdout=subprocess.DEVNULL, stderr=err)
        mover = Mover(confinement.groups)
        events["moved"] = mover.moved  # worker id -> pid, as they are moved
        try:
            drive(proc, mover, job, events)
        finally:
            stop(proc)
    check = subprocess.run([sys.executable, "-m", "bno_hvd", "ledger", "check", job.log], capture_output=True)
    entries = read_entries(job.log)
    return {
        "strategy": job.strategy,
        "rc": proc.returncode,
        "ledger_ok": check.returncode == 0,
        "samples_per_s": throughput(entries, job.schedule.warmup),
        "events": events,
        "phases": phases(entries),
    }
