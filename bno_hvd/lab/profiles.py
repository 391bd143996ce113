"""The profile suite: ``bno-hvd bench --suite real`` (REAL slowness nobody tuned for, and EMULATED).

Every profile is one ``mpirun`` job of 4 ranks (those of :data:`MORE`, run by name only: 8 or 4)
running ``bno-hvd bench --rounds R`` with the **default flags** of every strategy, so what it
shows is what a user gets. Some profiles set the CPU limits with bno-hvd's own ``--cpu-quota``;
most set them *outside* bno-hvd, as a container or a Slurm job does: the suite makes a cgroup per
rank and starts each rank inside it (:mod:`bno_hvd.lab.confine`); one slows a rank with busy
processes on its core, with no quota at all. Each profile also runs ``fixed`` at the split a user
would write by hand from what they know of the ranks, the bar to clear.

Whatever the suite creates outside its output directory (cgroups, busy processes) is removed
when a profile ends, also when it fails; a reaper outside the cgroups removes them if the suite
itself is killed (:func:`bno_hvd.lab.cpuquota.start_reaper`).

Results are labelled per profile: ``REAL`` (cgroup quotas, competing processes) or
``EMULATED`` (a rank waits as if slower), never one for the other.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from bno_hvd.allocation.rounding import round_to_total
from bno_hvd.common.atomic import write_json_atomic, write_text_atomic
from bno_hvd.lab.confine import CGROUPS, CPUS
from bno_hvd.lab.cpuquota import CpuQuotaGroup, end_reaper, find_place, start_reaper
from bno_hvd.lab.pairing import comparison
from bno_hvd.lab.suitetable import suite_markdown
from bno_hvd.processes.mpienv import mpi_env

BASE_BATCH = 32  # bench's default base batch: the global batch is 32 x the ranks (128 for 4)
SCHEDULE_BASE = (100, 20)  # the updates and warm-up a profile's schedule is written for (the suite's defaults)


@dataclass(frozen=True)
class Profile:
    """One way the ranks differ. ``hand``: each rank's speed as a user would guess it (the fixed split)."""

    name: str
    kind: str  # "REAL" or "EMULATED"
    what: str  # one line for the table
    hand: tuple[float, ...]
    flags: tuple[str, ...] = ()  # bench flags: bno-hvd's own quotas, emulation
    outside: tuple[float, ...] | None = None  # CPU limits set outside bno-hvd (share of a core per rank)
    period_ms: float = 10.0  # CFS period of the outside limits
    competing: int = 0  # busy processes on rank 3's core (ranks 0-2 share the other core)
    schedule: tuple = ()  # --cpu-quota-schedule entries (update of SCHEDULE_BASE, quotas): scaled_schedule

    def label(self) -> str:
        return f"{self.kind}: {self.what}"

    @property
    def ranks(self) -> int:
        return len(self.hand)


PROFILES = (
    Profile(
        "quota-own-10ms",
        "REAL",
        "--cpu-quota 0.45,0.45,0.45,0.15 (set by bno-hvd), period 10 ms",
        (0.45, 0.45, 0.45, 0.15),
        flags=("--cpu-quota", "0.45,0.45,0.45,0.15"),
    ),
    Profile(
        "outside-100ms",
        "REAL",
        "limits 0.45,0.45,0.45,0.15 set outside (a cgroup per rank, as a container), period 100 ms",
        (0.45, 0.45, 0.45, 0.15),
        outside=(0.45, 0.45, 0.45, 0.15),
        period_ms=100.0,
    ),
    Profile(
        "outside-two-slow-20ms",
        "REAL",
        "limits 0.5,0.5,0.17,0.17 set outside, period 20 ms (two throttled ranks)",
        (0.5, 0.5, 0.17, 0.17),
        outside=(0.5, 0.5, 0.17, 0.17),
        period_ms=20.0,
    ),
    Profile(
        "outside-tiny-20ms",
        "REAL",
        "limits 0.45,0.45,0.45,0.08 set outside, period 20 ms (a rank below 0.1 of a core)",
        (0.45, 0.45, 0.45, 0.08),
        outside=(0.45, 0.45, 0.45, 0.08),
        period_ms=20.0,
    ),
    Profile(
        "outside-levels-10ms",
        "REAL",
        "limits 0.45,0.35,0.25,0.12 set outside, period 10 ms (four levels)",
        (0.45, 0.35, 0.25, 0.12),
        outside=(0.45, 0.35, 0.25, 0.12),
        period_ms=10.0,
    ),
    Profile(
        "outside-equal-10ms",
        "REAL",
        "limits 0.45 for every rank set outside, period 10 ms (nothing to balance)",
        (1.0, 1.0, 1.0, 1.0),
        outside=(0.45, 0.45, 0.45, 0.45),
        period_ms=10.0,
    ),
    Profile(
        "competing-process",
        "REAL",
        "no quota: ranks 0-2 share core 0, rank 3 shares core 1 with 5 busy processes",
        (1 / 3, 1 / 3, 1 / 3, 1 / 6),
        competing=5,
    ),
    Profile(
        "quota-schedule",
        "REAL",
        "--cpu-quota-schedule (set by bno-hvd): 0.45 each; rank 3 at 0.12 in the middle half of the timed updates",
        (0.45, 0.45, 0.45, 0.45 * 0.5 + 0.12 * 0.5),  # half of the timed updates at each
        schedule=((0, (0.45, 0.45, 0.45, 0.45)), (40, (0.45, 0.45, 0.45, 0.12)), (80, (0.45, 0.45, 0.45, 0.45))),
    ),
    Profile(
        "quota-tiny-lifted",
        "REAL",
        "--cpu-quota-schedule (set by bno-hvd): 0.45,0.45,0.45,0.06; rank 3 at 0.45 after half the timed updates",
        (0.45, 0.45, 0.45, 0.06 * 0.5 + 0.45 * 0.5),
        schedule=((0, (0.45, 0.45, 0.45, 0.06)), (60, (0.45, 0.45, 0.45, 0.45))),
    ),
    Profile(
        "emulated-3-levels",
        "EMULATED",
        "speeds 1,0.6,0.6,0.3 (three levels)",
        (1.0, 0.6, 0.6, 0.3),
        flags=("--emulate-speed", "1,0.6,0.6,0.3"),
    ),
    Profile(
        "emulated-4-levels",
        "EMULATED",
        "speeds 1,0.75,0.5,0.25 (four levels)",
        (1.0, 0.75, 0.5, 0.25),
        flags=("--emulate-speed", "1,0.75,0.5,0.25"),
    ),
)
# run by name only (``--profiles``): 8 ranks; for a user's script (benchmarks/dropin_real.py), two more
_LIMITS = (0.45, 0.45, 0.45, 0.15)
MORE = (
    Profile("outside-10ms", "REAL", "limits 0.45,0.45,0.45,0.15 set outside, period 10 ms", _LIMITS, outside=_LIMITS),
    Profile("unlimited", "REAL", "no limit: 4 ranks share the 2 cores", (1.0, 1.0, 1.0, 1.0)),
    Profile(
        "outside-8-four-tiny-50ms",
        "REAL",
        "8 ranks: limits 0.2 x4 and 0.03 x4 set outside, period 50 ms (four ranks far below 0.1 of a core)",
        (0.2,) * 4 + (0.03,) * 4,
        outside=(0.2,) * 4 + (0.03,) * 4,
        period_ms=50.0,  # (a quota is at least 1 ms: 0.03 of a core needs a period of 34 ms or more)
    ),
)
BY_NAME = {p.name: p for p in PROFILES + MORE}


def hand_split(profile: Profile, total: int | None = None) -> list[int]:
    """The split a user would write by hand: the global batch in proportion to ``profile.hand``."""
    total = BASE_BATCH * profile.ranks if total is None else total
    return round_to_total([total * h / sum(profile.hand) for h in profile.hand], total, 1)


@dataclass
class Confinement:
    """What a profile sets up outside bno-hvd (cgroups, busy processes), and removes again."""

    profile: Profile
    groups: list = field(default_factory=list)
    reapers: list = field(default_factory=list)
    busy: list = field(default_factory=list)

    def __enter__(self) -> dict:
        env = {}
        try:
            if self.profile.outside:
                place = find_place()
                period = int(self.profile.period_ms * 1000)
                for rank, quota in enumerate(self.profile.outside):
                    group = CpuQuotaGroup(place, f"bno-hvd-suite-{os.getpid()}-r{rank}", period)
                    self.groups.append(group.create(quota))
                    self.reapers.append(start_reaper(group.path))
                env[CGROUPS] = ",".join(g.path for g in self.groups)
            if self.profile.competing:
                env[CPUS] = "0,0,0,1"
                for _ in range(self.profile.competing):
                    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_die_with_parent)
                    os.sched_setaffinity(proc.pid, {1})
                    self.busy.append(proc)
        except BaseException:
            self.__exit__()
            raise
        return env

    def __exit__(self, *exc) -> None:
        for proc in self.busy:
            proc.kill()
            proc.wait()
        for group, reaper in zip(self.groups, self.reapers):
            group.remove()  # the ranks have ended; the reaper removes it if a member lingers
            end_reaper(reaper)


def _die_with_parent() -> None:
    """In a busy process, before it starts: SIGKILL when the suite ends, however it ends (prctl)."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def scaled_schedule(profile: Profile, updates: int, warmup: int) -> list[tuple[int, tuple]]:
    """The profile's schedule for a run of ``updates`` with ``warmup``: each change keeps its place
    among the timed updates (written for :data:`SCHEDULE_BASE`, 100 with 20 of warm-up: a change
    at 40 of 100 comes at 60 of 180 with 20 of warm-up). Rounds of equal blocks then fall on each
    phase of the schedule in the same proportion whatever ``--updates`` is (with the updates
    unscaled, 6 of 8 rounds of a 180-update run came after the last change)."""
    base_updates, base_warmup = SCHEDULE_BASE
    scale = (updates - warmup) / (base_updates - base_warmup)
    return [(0 if u == 0 else max(0, round(warmup + (u - base_warmup) * scale)), q) for u, q in profile.schedule]


def bench_args(profile: Profile, out: str, rounds: int, updates: int, warmup: int, strategies) -> list[str]:
    """The ``bno-hvd bench`` command line of one profile (default flags of every strategy)."""
    args = [
        *profile.flags,
        "--strategies",
        ",".join(strategies),
        "--updates",
        str(updates),
        "--warmup",
        str(warmup),
        "--rounds",
        str(rounds),
        "--no-progress",
        "--out",
        out,
    ]
    if "fixed" in strategies:
        args += ["--batch-sizes", ",".join(map(str, hand_split(profile)))]
    if profile.schedule:
        path = os.path.join(out, "quota-schedule.json")
        with open(path, "w") as fh:
            json.dump([{"update": u, "quotas": list(q)} for u, q in scaled_schedule(profile, updates, warmup)], fh)
        args += ["--cpu-quota-schedule", path]
    return args


def run_profile(
    profile: Profile, out_dir: str, rounds, updates, warmup, strategies, timeout: float, mpirun_command, flags=()
):
    """One profile's job; returns its bench.json rows (raises RuntimeError when the job fails).
    ``mpirun_command(n, args)``: the launcher's command line (:func:`bno_hvd.cli.launching.mpirun_command`);
    ``flags``: more flags of every job's ``bench`` (``--engine torch``)."""
    out = os.path.join(out_dir, profile.name)
    os.makedirs(out, exist_ok=True)
    bno = shutil.which("bno-hvd") or "bno-hvd"
    cmd = [sys.executable, "-m", "bno_hvd.lab.confine", bno, "bench"]
    cmd += bench_args(profile, out, rounds, updates, warmup, strategies) + list(flags)
    with Confinement(profile) as extra, open(os.path.join(out, "bench.log"), "w") as log:
        proc = subprocess.run(
            mpirun_command(profile.ranks, cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=mpi_env(extra=extra),
            timeout=timeout,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"profile {profile.name}: the job exited with {proc.returncode}; see {out}/bench.log")
    with open(os.path.join(out, "bench.json")) as fh:
        return json.load(fh)


def run_suite(
    profiles, out_dir: str, rounds: int, updates: int, warmup: int, strategies, mpirun_command, echo, flags=()
):
    """Every profile in turn; writes ``suite.json`` and ``suite.md`` in ``out_dir`` after each one
    (a failed profile is reported and the suite goes on). Returns the summary rows."""
    rows = []
    for number, profile in enumerate(profiles, 1):
        echo(f"== profile {number}/{len(profiles)}: {profile.name} ({profile.label()})")
        try:
            bench = run_profile(profile, out_dir, rounds, updates, warmup, strategies, 3600, mpirun_command, flags)
            rows.append(profile_row(profile, bench))
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
            echo(f"bno-hvd: warning: {err}")
            rows.append({"profile": profile.name, "label": profile.label(), "error": str(err)})
        write_json_atomic(os.path.join(out_dir, "suite.json"), rows)
        write_text_atomic(os.path.join(out_dir, "suite.md"), suite_markdown(rows))
    return rows


def profile_row(profile: Profile, bench: list[dict]) -> dict:
    """One profile's summary: per strategy, its paired ratio to equal, to the best other of each
    round and to the peer with the best median (lab/pairing.py), and of ideal."""
    strategies = {}
    top = _top_peers(bench)
    for row in bench:
        paired = dict(top.get(row["strategy"], {}), **(row.get("paired") or {}))
        strategies[row["strategy"]] = {
            "vs_equal": [paired.get("median"), paired.get("low"), paired.get("high")],
            "vs_best_other": paired.get("vs_best_peer", [None, None, None]),
            "vs_top_peer": paired.get("vs_top_peer", [None, None, None]),
            "top_peer": paired.get("top_peer"),
            "of_ideal": row.get("fraction_of_ideal"),
            "samples_per_s": row.get("samples_per_s"),
            "rates": paired.get("rates"),  # per round, for ratios between any two strategies
            "final_batch_sizes": row.get("final_batch_sizes"),
        }
    return {
        "profile": profile.name,
        "label": profile.label(),
        "hand_split": hand_split(profile),
        "strategies": strategies,
    }


def _top_peers(bench: list[dict]) -> dict:
    """The comparison with the top peer, from the per-round rates, for a bench.json written before
    bench reported it (an older suite re-tabled: :func:`retable`)."""
    rates = {row["strategy"]: (row.get("paired") or {}).get("rates") for row in bench}
    if "equal" not in rates or not all(rates.values()):
        return {}
    table = comparison({n: [math.nan if v is None else v for v in r] for n, r in rates.items()}, "equal")
    return {n: {"vs_top_peer": t["vs_top_peer"], "top_peer": t["top_peer"]} for n, t in table.items()}


def retable(out_dir: str) -> list[dict]:
    """Write ``suite.json`` and ``suite.md`` again from the profiles' ``bench.json`` files in
    ``out_dir`` (the suite's tables as this version makes them; the measurements are untouched):
    ``python -m bno_hvd.lab.profiles DIR``."""
    with open(os.path.join(out_dir, "suite.json")) as fh:
        names = [row["profile"] for row in json.load(fh)]
    rows = []
    for name in names:
        with open(os.path.join(out_dir, name, "bench.json")) as fh:
            rows.append(profile_row(BY_NAME[name], json.load(fh)))
    write_json_atomic(os.path.join(out_dir, "suite.json"), rows)
    write_text_atomic(os.path.join(out_dir, "suite.md"), suite_markdown(rows))
    return rows


if __name__ == "__main__":
    retable(sys.argv[1])
