"""What makes the ranks of a run differ, and the label every result of it carries.

Two sources, never to be confused in a table or a figure:

- EMULATED (:mod:`bno_hvd.lab.emulation`): a rank computes, then waits, as if it were a device of
  relative speed f; the machine itself is not slower.
- REAL (:mod:`bno_hvd.lab.cpuquota`): a rank runs in a cgroup with a CPU quota; everything it does,
  Horovod's and MPI's threads included, really gets that share of a core.

:func:`from_config` reads both from a run's flags (the one place their schedules are parsed),
``describe`` makes the JSON stored in ``run.json`` (key ``heterogeneity``); ``label`` turns it
into the one line shown with results. Older run.json files (key ``emulation``) are read too.
"""

from __future__ import annotations

from dataclasses import dataclass

from bno_hvd.common.parsing import RankSchedule
from bno_hvd.lab.cpuquota import load_quota_schedule, period_for
from bno_hvd.lab.emulation import check_emulated_rate, load_schedule
from bno_hvd.training.hooks import NO_HETEROGENEITY

NONE = NO_HETEROGENEITY


@dataclass(frozen=True)
class Heterogeneity:
    """A run's emulated speeds and real CPU quotas (each None when not asked for)."""

    speeds: RankSchedule | None = None
    rate: float | None = None
    quotas: RankSchedule | None = None
    quota_period_us: int | None = None

    def describe(self) -> dict:
        return describe(self.speeds, self.rate, self.quotas, self.quota_period_us)

    def label(self) -> str:
        return label(self.describe())

    def changes(self) -> list[int]:
        """Updates at which a speed or a quota changes."""
        return sorted({u for s in (self.speeds, self.quotas) if s is not None for u in s.changes()})


def from_config(cfg, n_ranks: int) -> Heterogeneity:
    """The heterogeneity ``cfg`` asks for on ``n_ranks`` ranks; :class:`UsageError` on a bad schedule."""
    speeds = quotas = period = None
    if cfg.emulate_schedule:
        speeds = load_schedule(cfg.emulate_schedule, n_ranks)
        check_emulated_rate([v for _, values in speeds.entries for v in values], cfg.emulate_rate, "--emulate-schedule")
    elif cfg.emulate_speed:
        speeds = RankSchedule.constant(cfg.emulate_speed)
    if cfg.cpu_quota_schedule:
        quotas = load_quota_schedule(cfg.cpu_quota_schedule, n_ranks)
    elif cfg.cpu_quota:
        quotas = RankSchedule.constant(cfg.cpu_quota)
    if quotas is not None:
        period = period_for(quotas, cfg.cpu_quota_period_ms)
    return Heterogeneity(speeds, cfg.emulate_rate if speeds is not None else None, quotas, period)


def describe(speeds=None, rate: float | None = None, quotas=None, quota_period_us: int | None = None) -> dict:
    """``speeds`` / ``quotas``: :class:`bno_hvd.common.parsing.RankSchedule` or None."""
    out = {}
    if speeds is not None:
        out["emulated"] = {"schedule": [[u, list(v)] for u, v in speeds.entries], "rate": rate}
    if quotas is not None:
        out["cpu_quota"] = {"schedule": [[u, list(v)] for u, v in quotas.entries], "period_us": quota_period_us}
    return out


def label(description: dict | None) -> str:
    """One line: 'EMULATED heterogeneity: ...', 'REAL: CPU-throttled ranks (cgroup quota) ...', or both."""
    description = description or {}
    parts = []
    emu = description.get("emulated")
    if emu:
        parts.append(
            f"EMULATED heterogeneity: {_values(emu['schedule'], 'speeds', 'speed')}, "
            f"{float(emu['rate']):g} samples/s at speed 1"
        )
    quota = description.get("cpu_quota")
    if quota:
        parts.append(
            f"REAL: CPU-throttled ranks (cgroup quota): {_values(quota['schedule'], 'quotas', 'quota')} "
            f"of a core, period {int(quota['period_us']) / 1000:g} ms"
        )
    return "; ".join(parts) or NONE


def label_of_run(run_meta: dict) -> str:
    """The label of a logged run (``run.json``), also of runs logged before this module existed."""
    if "heterogeneity" in run_meta:
        return label(run_meta["heterogeneity"])
    emu = run_meta.get("emulation")
    return label({"emulated": {"schedule": emu["schedule"], "rate": emu["rate"]}} if emu else None)


def is_emulated(description: dict | None) -> bool:
    return bool((description or {}).get("emulated"))


def _values(schedule, plural: str, singular: str) -> str:
    if len(schedule) == 1:
        return f"{plural} " + ",".join(f"{float(v):g}" for v in schedule[0][1])
    return f"schedule of {len(schedule)} {singular} sets"


def outside_label(limits: list | None) -> str | None:
    """The label of CPU limits set outside bno-hvd (a container's, Slurm's), as the ranks read them
    from their cgroups at the start; None when no rank had one."""
    if not limits or all(x is None for x in limits):
        return None
    shown = ",".join("none" if x is None else f"{float(x):.3g}" for x in limits)
    return f"REAL: CPU limits set outside bno-hvd (read from each rank's cgroup): {shown} of a core"
