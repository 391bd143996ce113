"""The lab's way into a run: emulated speeds, REAL CPU quotas and injected faults, as hooks.

The training application and the library know none of them. ``bno-hvd train``, ``bench`` and ``experiment`` pass
:func:`lab_plugin` to :func:`bno_hvd.training.loop.run_training`, which builds it on every rank
before the first collective (a bad schedule, or cgroups that cannot be written, end every rank
with one line) and calls its hooks (:mod:`bno_hvd.training.hooks`).

Usage::

    run_training(cfg, world, plugin=lab_plugin)
"""

from __future__ import annotations

from bno_hvd.lab import heterogeneity
from bno_hvd.lab.cpuquota import CpuQuotaHook, find_place
from bno_hvd.lab.emulation import DeviceEmulator, EmulationHook, check_emulated_rate
from bno_hvd.lab.faults import FaultInjector, parse_faults
from bno_hvd.training.hooks import Hook, Plugin


def check_lab_config(cfg) -> None:
    """What the lab's flags must satisfy before anything runs (one :class:`UsageError` line)."""
    if cfg.emulate_speed is not None:
        check_emulated_rate(cfg.emulate_speed, cfg.emulate_rate)
    parse_faults(cfg.inject_fault)


class LabPlugin(Plugin):
    """A run's emulated speeds, CPU quotas and faults (each only where its flag is set)."""

    def __init__(self, cfg, n_ranks: int):
        check_lab_config(cfg)
        self.cfg = cfg
        self.heterogeneity = heterogeneity.from_config(cfg, n_ranks)
        if self.heterogeneity.quotas is not None:
            find_place()  # are cgroups writable here? one clear line if not, and nothing left behind
        self.description = self.heterogeneity.describe()
        self.label = self.heterogeneity.label()

    def hooks(self, rank: int) -> list[Hook]:
        hooks, hetero = [], self.heterogeneity
        if hetero.speeds is not None:
            hooks.append(EmulationHook(DeviceEmulator(rank, hetero.rate, hetero.speeds)))
        if hetero.quotas is not None:
            hooks.append(CpuQuotaHook(hetero.quotas, rank, hetero.quota_period_us))
        if self.cfg.inject_fault:
            hooks.append(FaultInjector.parse(self.cfg.inject_fault, rank))
        return hooks


def lab_plugin(cfg, n_ranks: int) -> LabPlugin:
    """The plugin factory ``run_training`` and ``prepare`` take."""
    return LabPlugin(cfg, n_ranks)
