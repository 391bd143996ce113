"""bno-hvd: heterogeneity-aware data-parallel training on Horovod with an mpi4py control plane.

Public API (re-exports only, loaded on first use so that the CLI starts without torch)::

    from bno_hvd import Balancer, make_strategy, MetricsMonitor
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "allocation": ("STRATEGY_NAMES", "ClusterMetrics", "Strategy", "bno_batch_sizes", "make_strategy"),
    "balancer": ("Balancer", "Step", "StepStats"),
    "control.monitor": ("MetricsMonitor",),
    "emulation": ("DeviceEmulator",),
    "errors": ("TrainingError", "UsageError"),
    "hooks": ("Hook",),
    "loader": ("Batch",),
    "plan": ("AllocationPlan",),
    "records": ("RankStep", "UpdateRecord"),
    "sampler": ("UnevenSampler",),
    "weighting": ("rank_weight", "sample_weights", "scaled_lr"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE) + ["__version__"]


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'bno_hvd' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
