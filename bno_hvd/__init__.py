"""bno-hvd: heterogeneity-aware data-parallel training on Horovod with an mpi4py control plane.

Public API (re-exports only)::

    from bno_hvd import Balancer, make_strategy, MetricsMonitor
"""
from .allocation import STRATEGY_NAMES, ClusterMetrics, Strategy, bno_batch_sizes, make_strategy
from .balancer import Balancer, Step, StepStats
from .control.monitor import MetricsMonitor
from .emulation import DeviceEmulator
from .errors import UsageError
from .sampler import UnevenSampler
from .weighting import rank_weight, sample_weights, scaled_lr

__version__ = "0.1.0"

__all__ = ["Balancer", "Step", "StepStats", "MetricsMonitor", "DeviceEmulator", "UnevenSampler",
           "make_strategy", "Strategy", "STRATEGY_NAMES", "ClusterMetrics", "bno_batch_sizes",
           "rank_weight", "sample_weights", "scaled_lr", "UsageError", "__version__"]
