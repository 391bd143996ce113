"""THE METHOD: who gets how many samples of each update, and what weight each rank's loss has.
Pure: no MPI, no Horovod, no torch, no clock; every number arrives as an argument. May import
:mod:`bno_hvd.common` only.

* :mod:`.paper`     - BNO eqs. (1)-(5) exactly        * :mod:`.bno`        - the paper's strategy
* :mod:`.balanced`  - ours, equal finish time         * :mod:`.fitting`    - its step-time fits and solve
* :mod:`.offsets`   - what it adds to a rank's time   * :mod:`.baselines`  - equal/random/fixed/LB-BSP/...
* :mod:`.strategy`  - the interface                   * :mod:`.rounding`   - integer splits
* :mod:`.metrics`   - ClusterMetrics                  * :mod:`.metrics_file` - JSON in/out
* :mod:`.plan`      - which sizes each update uses    * :mod:`.sampler`    - the sample stream, every sample once
* :mod:`.weighting` - loss weights, LR scaling        * :mod:`.throughput` - OPS over a window of steps
* :mod:`.costmodel` - a sequence's cost, work units   * :mod:`.partition` - shares of work -> sequences
* :mod:`.microbatch` - micro-batches under a token cap * :mod:`.sitting`    - when a rank sits out, and is back

Usage::

    strategy = make_strategy("balanced", n_ranks=4, base_batch_size=32)
    sizes = strategy.initial()
"""

from bno_hvd.allocation.balanced import EqualFinishStrategy
from bno_hvd.allocation.baselines import (
    EqualStrategy,
    FixedStrategy,
    LBBSPStrategy,
    ParamHubStrategy,
    ProportionalStrategy,
    RandomStrategy,
)
from bno_hvd.allocation.bno import BNOStrategy
from bno_hvd.allocation.fitting import fit_shape, solve_equal_finish
from bno_hvd.allocation.metrics import ClusterMetrics, usable_ranks
from bno_hvd.allocation.metrics_file import load_metrics_file, metrics_to_json
from bno_hvd.allocation.paper import bno_batch_sizes, compute_k, memory_weights, network_weights
from bno_hvd.allocation.rounding import round_to_total
from bno_hvd.allocation.strategy import Strategy, check_sizes
from bno_hvd.common.errors import UsageError

STRATEGY_NAMES = ("bno", "balanced", "equal", "random", "fixed", "proportional", "lbbsp", "paramhub")

_CLASSES = {
    cls.name: cls
    for cls in (
        BNOStrategy,
        EqualFinishStrategy,
        EqualStrategy,
        RandomStrategy,
        FixedStrategy,
        ProportionalStrategy,
        LBBSPStrategy,
        ParamHubStrategy,
    )
}
assert set(_CLASSES) == set(STRATEGY_NAMES)


def make_strategy(
    name, n_ranks, base_batch_size, *, global_batch=None, seed=0, batch_sizes=None, **options
) -> Strategy:
    """Build the named strategy; any bad argument raises :class:`UsageError` with a fix.

    Args:
        name: ``balanced``, ``bno``, ``equal``, ``random``, ``fixed``, ``proportional``, ``lbbsp``
            or ``paramhub``, optionally with options as a spec: ``balanced:deadband=0.1:sit_out=0``;
            ``fixed:8,4,2,2`` is ``fixed`` with that split.
        n_ranks: the number of ranks N.
        base_batch_size: the per-rank base batch B.
        global_batch: the samples of one update (None: N*B).
        seed: for strategies that draw (``random``).
        batch_sizes: the split of ``fixed`` (required by it, refused by the others).
        **options: the strategy's own knobs (``balanced``: ``deadband``, ``sit_out``, ``window``,
            ``starved_share``; docs/heterogeneity.md).

    Example::

        strategy = bno.make_strategy("balanced", hvd.size(), 32, deadband=0.1)
        fixed = bno.make_strategy("fixed", 4, 32, batch_sizes=[40, 40, 40, 8])
        train_sampler = bno.Balancer.for_world(train_set, 32, strategy)
    """
    name, spec_options = split_spec(name)
    if "batch_sizes" in spec_options:  # "fixed:8,4,2,2"
        if batch_sizes is not None and list(batch_sizes) != spec_options["batch_sizes"]:
            given = ",".join(map(str, spec_options["batch_sizes"]))
            raise UsageError(f"fixed's split given twice: fixed:{given} and batch_sizes={list(batch_sizes)}")
        batch_sizes = spec_options.pop("batch_sizes")
    options = {**spec_options, **options}
    check_sizes(n_ranks, base_batch_size, global_batch, seed)
    if name == "fixed":
        return FixedStrategy(
            n_ranks, base_batch_size, batch_sizes=batch_sizes, global_batch=global_batch, seed=seed, **options
        )
    if batch_sizes is not None:
        raise UsageError(
            f"--batch-sizes only applies to --strategy fixed (got --strategy {name}); drop it or use 'fixed'"
        )
    return _CLASSES[name](n_ranks, base_batch_size, global_batch=global_batch, seed=seed, **options)


def split_spec(spec: str) -> tuple[str, dict]:
    """``"balanced:deadband=0.1:sit_out=0"`` -> ``("balanced", {"deadband": 0.1, "sit_out": 0})``.

    A strategy with some of its options set, as ``--strategy`` and bench's ``--strategies`` take it
    (a bench can so compare ``balanced`` with ``balanced:sit_out=0``, an ablation); ``"fixed:8,4,2,2"``
    -> ``("fixed", {"batch_sizes": [8, 4, 2, 2]})``. Values
    are integers, floats, ``none``, ``true`` or ``false``; whether the option exists and its value
    fits is the strategy's check. :class:`UsageError` names what is wrong."""
    name, *parts = str(spec).split(":")
    name = name.strip()
    if name not in _CLASSES:
        raise UsageError(f"unknown strategy {name!r}; choose one of: {', '.join(STRATEGY_NAMES)}")
    if name == "fixed" and len(parts) == 1 and all(p.strip().isdigit() for p in parts[0].split(",")):
        return name, {"batch_sizes": [int(p) for p in parts[0].split(",")]}  # "fixed:8,4,2,2": that split
    options = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"strategy {spec!r}: write each option as name=value, e.g. balanced:deadband=0.1")
        options[key.strip()] = _option_value(value.strip())
    if name == "fixed" and options:
        raise UsageError("strategy 'fixed' takes no options; give its split as fixed:8,4,2,2 or with --batch-sizes")
    return name, options


def check_spec(spec: str) -> str:
    """``spec`` itself, or :class:`UsageError` (one line) when it names no strategy or an option
    that strategy does not have (checked by building it; the checks do not depend on the ranks)."""
    if split_spec(spec)[0] != "fixed":
        make_strategy(spec, 2, 32)
    return spec


def _option_value(text: str):
    low = text.lower()
    if low in ("none", "true", "false"):
        return {"none": None, "true": True, "false": False}[low]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


__all__ = [
    "STRATEGY_NAMES",
    "split_spec",
    "check_spec",
    "make_strategy",
    "Strategy",
    "ClusterMetrics",
    "usable_ranks",
    "UsageError",
    "compute_k",
    "memory_weights",
    "network_weights",
    "bno_batch_sizes",
    "round_to_total",
    "fit_shape",
    "solve_equal_finish",
    "load_metrics_file",
    "metrics_to_json",
    "BNOStrategy",
    "EqualFinishStrategy",
    "EqualStrategy",
    "RandomStrategy",
    "FixedStrategy",
    "ProportionalStrategy",
    "LBBSPStrategy",
    "ParamHubStrategy",
]
