"""Checks of what a caller passes the library's public API (``Balancer``, ``Balancer.for_world``,
``bno_hvd.DataLoader``, ``bno_hvd.DistributedOptimizer``, ``exact_dropout``, ``make_strategy``).

Each check returns the value (an ``int``, a length) or raises :class:`UsageError` with one line
that names the argument, shows what it got and says what is accepted. Values are shown by
:func:`describe`, which never calls a user object's ``__str__``/``__repr__`` (they may be long,
hold line breaks or raise). ``tests/library/test_fuzz_api.py`` holds the entry points to that.

Usage::

    every = check_int("rebalance_every", rebalance_every, 1, 10**9)
    n = dataset_length(dataset, "Balancer.for_world's dataset")
"""

from __future__ import annotations

import math
import numbers

from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import as_float

MAX_SAMPLES = 10**9  # samples of a dataset: each epoch draws a permutation of them (8 bytes each)


def describe(value, limit: int = 40) -> str:
    """A caller's value for a one-line message: short numbers and strings as ``repr`` shows them,
    anything else by its type (``a list of 3``, ``a Tensor``)."""
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if abs(value) < 10**limit else f"an integer of more than {limit} digits"
    if isinstance(value, str):
        text = repr(value if len(value) <= limit else value[:limit] + "...")
        return text if text.isprintable() else ascii(value[:limit])
    if isinstance(value, (list, tuple, dict, set)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def check_int(name: str, value, low: int, high: int, hint: str = "") -> int:
    """``value`` as an int in ``[low, high]`` (an ``int``, not a bool, a float or a string)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise UsageError(f"{name} must be an integer, got {describe(value)}{hint and '; ' + hint}")
    if not low <= value <= high:
        raise UsageError(f"{name} must be between {low} and {high}, got {describe(value)}{hint and '; ' + hint}")
    return int(value)


def check_optional_int(name: str, value, low: int, high: int, hint: str = "") -> int | None:
    """None, or :func:`check_int`."""
    return None if value is None else check_int(name, value, low, high, hint)


def check_number(name: str, value, low: float, high: float) -> float:
    """``value`` as a finite float in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(as_float(value)):
        raise UsageError(f"{name} must be a finite number, got {describe(value)}")
    if not low <= as_float(value) <= high:
        raise UsageError(f"{name} must be between {low:g} and {high:g}, got {describe(value)}")
    return as_float(value)


def check_flag(name: str, value) -> bool:
    """``value`` is True or False."""
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be True or False, got {describe(value)}")
    return value


def check_callable(name: str, value, optional: bool = True):
    """``value`` is callable (or None, when ``optional``)."""
    if (value is None and optional) or callable(value):
        return value
    raise UsageError(f"{name} must be a function{' or None' if optional else ''}, got {describe(value)}")


def check_keys(where: str, given, allowed) -> None:
    """Every keyword in ``given`` is one of ``allowed``."""
    unknown = sorted(str(k) for k in given if k not in allowed)
    if unknown:
        raise UsageError(f"{where} has no option {describe(unknown[0])}; valid options: {', '.join(sorted(allowed))}")


def dataset_length(dataset, where: str) -> int:
    """``len(dataset)`` (or ``dataset`` itself, an int) as a number of samples in 1..MAX_SAMPLES."""
    if isinstance(dataset, numbers.Integral) and not isinstance(dataset, bool):
        length = int(dataset)
    elif not hasattr(type(dataset), "__len__") or not hasattr(type(dataset), "__getitem__"):
        raise UsageError(
            f"{where} needs a map-style dataset (with __len__ and __getitem__) or its length, got {describe(dataset)}"
        )
    else:
        try:
            length = len(dataset)
        except (TypeError, ValueError, OverflowError) as err:
            raise UsageError(f"{where}: len(dataset) failed ({first_line(err)}); give it a __len__ >= 1") from None
    if length < 1:
        raise UsageError(f"{where} has {length} samples; a dataset needs at least one sample")
    if length > MAX_SAMPLES:
        raise UsageError(
            f"{where} has {length} samples, more than the {MAX_SAMPLES} a run can permute each epoch; "
            "split it into shards of at most that"
        )
    return length


def first_line(err: BaseException, limit: int = 300) -> str:
    """An exception as one short line: ``Type: its first line``."""
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else ""
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def check_balancer(comm, strategy, dataset_len, **options) -> int:
    """The arguments of ``Balancer(comm, strategy, dataset_len, **options)``; the dataset's length.

    Duck-typed, so that this wing imports no other: ``comm`` answers mpi4py's calls the control
    plane makes, ``strategy`` a Strategy's (``initial``, ``rebalance``); whether the strategy fits
    the world is checked collectively when the Balancer starts its control plane."""
    if not all(callable(getattr(comm, name, None)) for name in ("Get_rank", "Get_size", "bcast", "gather")):
        raise UsageError(
            f"comm must be an mpi4py communicator (MPI.COMM_WORLD.Dup()) or a TorchComm, got {describe(comm)}"
        )
    if not all(callable(getattr(strategy, name, None)) for name in ("initial", "rebalance", "state_dict")):
        raise UsageError(
            f"strategy must be a bno_hvd Strategy (make_strategy(name, n_ranks, batch_size)), got {describe(strategy)}"
        )
    length = dataset_length(dataset_len, "Balancer's dataset_len")
    o = options
    check_int("seed", o["seed"], 0, 2**32 - 1)
    check_int("rebalance_every", o["rebalance_every"], 1, 10**9, "rank 0 rebalances every that many updates")
    check_int("window", o["window"], 1, 10**6, "the recent updates each rank keeps for its fits")
    check_optional_int("max_batch", o["max_batch"], 1, 10**6, "this rank's cap in samples per pass, or None")
    check_optional_int("lag", o["lag"], 1, 10**9, "None lets the loaders' prefetch decide it")
    check_optional_int("max_tokens", o["max_tokens"], 1, 10**12, "this rank's cap in padded tokens per pass")
    check_optional_int("global_count", o["global_count"], 1, MAX_SAMPLES)
    check_optional_int("global_tokens", o["global_tokens"], 1, 10**15)
    for name in ("report_filter", "sync"):
        check_callable(name, o[name])
    check_flag("shares", o["shares"])
    if o["sit_out"] is not None:  # None: the drop-ins decide (bno_hvd.library.sitout)
        check_flag("sit_out", o["sit_out"])
    monitor = o["monitor"]
    if monitor is not None and not callable(getattr(monitor, "latest_row", None)):
        raise UsageError(f"monitor must be a started MetricsMonitor or None, got {describe(monitor)}")
    lengths = per_sample("lengths", o["lengths"], length, integers=True, low=1)
    work = per_sample("work", o["work"], length, integers=False, low=0)
    per_sample("emulated_work", o["emulated_work"], length, integers=False, low=0)
    if o["shares"] and (work is None or lengths is None or (o["global_count"] is None and o["global_tokens"] is None)):
        raise UsageError("shares=True needs work= and lengths= (one per sample) and global_count= or global_tokens=")
    if o["max_tokens"] is not None and lengths is None:
        raise UsageError("max_tokens caps padded tokens: it needs lengths= (the tokens of each sample)")
    return length


def per_sample(name: str, values, length: int, *, integers: bool, low: float):
    """None, or one finite number >= ``low`` per sample (integers when ``integers``) as an array."""
    if values is None:
        return None
    import numpy as np

    try:
        array = np.asarray(values)
    except (TypeError, ValueError, OverflowError) as err:
        raise UsageError(f"{name} must be one number per sample, got {describe(values)} ({first_line(err)})") from None
    kinds = "iu" if integers else "iuf"
    if array.ndim != 1 or len(array) != length or array.dtype.kind not in kinds:
        what = "integer" if integers else "number"
        raise UsageError(f"{name} must be one {what} per sample ({length}), got {describe(values)} of {array.dtype}")
    if len(array) and (not np.isfinite(array.astype(float)).all() or array.min() < low):
        raise UsageError(f"{name} must be finite and >= {low:g} for every sample")
    return array
