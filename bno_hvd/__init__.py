"""bno-hvd: heterogeneity-aware data-parallel training on Horovod with an mpi4py control plane.

Public API (re-exports only, loaded on first use so that the CLI starts without torch)::

    from bno_hvd import Balancer, make_strategy, MetricsMonitor

A Horovod script's port (docs/porting.md)::

    import bno_hvd as bno
    train_sampler = bno.Balancer.for_world(train_dataset, args.batch_size)
    train_loader = bno.DataLoader(train_dataset, sampler=train_sampler, **kwargs)
    optimizer = bno.DistributedOptimizer(optimizer, balancer=train_sampler, named_parameters=...)

The package is built in wings; each wing's ``__init__`` says what it holds and what it may import:

- :mod:`bno_hvd.common`     - errors, durable writes, parsing of user values (imports no other wing)
- :mod:`bno_hvd.allocation` - THE METHOD: strategies, fits, plans, the sample stream, loss weights
                              (pure: no MPI, no Horovod, no torch, no clock)
- :mod:`bno_hvd.data`       - DATA AND MODELS: datasets, torchvision and users' models
- :mod:`bno_hvd.processes`  - PROCESS PLUMBING: MPI then Horovod start-up, Gloo, MPI settings,
                              heap, garbage collector, sleeping waits, devices, CPU limits
- :mod:`bno_hvd.library`    - THE LIBRARY a script imports: the Balancer, its control plane, the
                              DataLoader, the drop-in for Horovod scripts, exact dropout
- :mod:`bno_hvd.training`   - THE ``bno-hvd train`` APPLICATION: config, the loop, hooks, tasks,
                              checkpoints, what a run writes (logs, TensorBoard)
- :mod:`bno_hvd.lab`        - THE LABORATORY: emulation, CPU quotas, faults, benchmarks,
                              experiments, reports (enters a run only through a plugin)
- :mod:`bno_hvd.cli`        - THE COMMAND LINE: commands, flags, console, hostfiles, launching
"""

import importlib

__version__ = "0.1.0"

# What a user's script calls, builds, subclasses (a Strategy and the metrics it reads) or catches;
# docs/api.md documents each one (tests/docs/test_docs_build.py checks), everything else is
# imported from the module that defines it
_EXPORTS = {
    "allocation": ("ClusterMetrics", "Strategy", "make_strategy"),
    "common.errors": ("TrainingError", "UsageError"),
    "data.models": ("build_model",),
    "library.balancer": ("Balancer", "Step"),
    "library.control.monitor": ("MetricsMonitor",),
    "library.ddp": ("DistributedDataParallel",),
    "library.dropin": ("DataLoader", "DistributedOptimizer"),
    "library.batchnorm": ("exact_batchnorm",),
    "library.dropout": ("exact_dropout",),
    "library.exact": ("exact",),
    "library.loader": ("Batch",),
    "library.sequences": ("measure_sequence_cost",),
    "library.start": ("init",),
    "library.step": ("TextOptions",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE) + ["__version__"]
# The framework adapters, a module each (bno.lightning.BalancedStrategy, ...): imported on first
# use, as each imports its framework
_FRAMEWORKS = {"lightning": "lightning", "accelerate": "accelerate", "hf": "trainer"}


def __getattr__(name):
    if name == "elastic":  # bno.elastic.State, @bno.elastic.run: a DDP script under elastic membership
        return importlib.import_module(".training.elasticscript", __name__)
    if name in _FRAMEWORKS:
        return importlib.import_module(f".library.frameworks.{_FRAMEWORKS[name]}", __name__)
    if name not in _WHERE:
        raise AttributeError(f"module 'bno_hvd' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
