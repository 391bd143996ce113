"""Reading logged runs back (``bno-hvd report``): every value the report uses is checked first.

Logs can be damaged after a run wrote them (a disk, an editor, another program, a copy cut
short). A damaged ``experiment.json``, ``run.json`` or ``result.json`` is one :class:`UsageError`
naming the file and the value, raised before the report writes anything. A line of
``updates.jsonl`` that is torn or has values of the wrong kind is skipped (a killed run leaves a
torn last line). A damaged ``ranks.json`` only costs its straggler picture (:func:`read_steps`
returns the reason instead).

Usage::

    meta = read_experiment_file(os.path.join(logdir, "experiment.json"))   # {} when there is none
    world_size, label = read_run_meta(os.path.join(run, "run.json"))
"""

from __future__ import annotations

import json
import math
import os

from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import read_json, show_path
from bno_hvd.lab.heterogeneity import label_of_run
from bno_hvd.library.timing import RankStep
from bno_hvd.training.results import COLUMNS, UpdateRecord, steps_from_json

_INTEGER_STEP_FIELDS = ("batch", "micro_batches")


def number(value, low: float = 0.0, high: float = math.inf, *, integer: bool = False) -> bool:
    """Is ``value`` a finite JSON number (an integer where asked) in ``[low, high]``? (bools are not)"""
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        return False
    try:
        return math.isfinite(value) and low <= value <= high
    except OverflowError:  # an integer too large for a float
        return False


def _need(ok: bool, path: str, key: str, wanted: str, value) -> None:
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise UsageError(
            f"{show_path(path)}: {key!r} must be {wanted}, got {shown}; the log is damaged or not bno-hvd's "
            "(run the experiment again, or remove that run's directory)"
        )


def _object(path: str, what: str) -> dict:
    data = read_json(path, what)
    _need(isinstance(data, dict), path, "the file", "a JSON object", type(data).__name__)
    return data


def read_experiment_file(path: str) -> dict:
    """``experiment.json`` with its models, strategies, block size and target checked ({} if absent)."""
    if not os.path.exists(path):
        return {}
    meta = _object(path, "experiment file")
    for key in ("models", "strategies"):
        names = meta.get(key)
        if names is not None:
            _need(isinstance(names, list) and all(map(_simple_name, names)), path, key, "a list of names", names)
    every = meta.get("average_every")
    _need(every is None or number(every, 1, integer=True), path, "average_every", "an integer >= 1", every)
    target = meta.get("target_accuracy")
    _need(target is None or number(target, 0, 1), path, "target_accuracy", "a number in [0, 1] or null", target)
    return meta


def read_run_meta(path: str) -> tuple[int, str]:
    """``run.json``: the run's world size and its heterogeneity label (EMULATED / REAL / none)."""
    meta = _object(path, "run file")
    size = meta.get("world_size")
    _need(number(size, 1, integer=True), path, "world_size", "an integer >= 1", size)
    try:
        label = label_of_run(meta)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError):
        _need(False, path, "heterogeneity", "what bno-hvd wrote", meta.get("heterogeneity", meta.get("emulation")))
    return size, label


_RESULT_NUMBERS = {  # key: (low, high, integer), each may also be null
    "wall_seconds": (0, math.inf, False),
    "updates": (0, math.inf, True),
    "samples": (0, math.inf, True),
    "test_accuracy": (0, 1, False),
    "compute_balance": (0, 1, False),
    "compute_balance_of_means": (0, 1, False),
    "outside_compute_share": (0, 1, False),
}
_EVAL_NUMBERS = {"update": (0, math.inf, True), "samples": (0, math.inf, True), "time": (0, math.inf, False)}


def read_result(path: str) -> dict | None:
    """``result.json`` with every value the report uses checked (None when the run wrote none)."""
    if not os.path.exists(path):
        return None
    result = _object(path, "result file")
    for key, (low, high, integer) in _RESULT_NUMBERS.items():
        value = result.get(key)
        wanted = f"{'an integer' if integer else 'a number'} in [{low:g}, {high:g}] or null"
        _need(value is None or number(value, low, high, integer=integer), path, key, wanted, value)
    _need(result.get("wall_seconds") is not None, path, "wall_seconds", "a number (every run writes it)", None)
    if result.get("test_accuracy") is not None:
        for key in ("updates", "samples", "wall_seconds"):  # the final evaluation's place
            _need(result.get(key) is not None, path, key, "a number (the run has a test accuracy)", None)
    evals = result.get("evals", [])
    _need(isinstance(evals, list) and all(isinstance(e, dict) for e in evals), path, "evals", "a list", evals)
    for e in evals:
        for key, (low, high, integer) in {**_EVAL_NUMBERS, "accuracy": (0, 1, False)}.items():
            _need(
                number(e.get(key), low, high, integer=integer), path, f"evals[].{key}", f"a number >= {low}", e.get(key)
            )
    return result


def read_steps(path: str) -> tuple[list[list[RankStep]] | None, str | None]:
    """``ranks.json`` as every rank's steps, or ``(None, why)`` when it is missing or damaged.
    The values are checked here; :func:`~bno_hvd.training.results.steps_from_json` then reads them."""
    if not os.path.exists(path):
        return None, f"{show_path(path)} does not exist"
    try:
        data = read_json(path, "ranks file")
    except UsageError as err:
        return None, str(err)
    why = _steps_damage(data)
    return (None, f"{show_path(path)}: {why}") if why else (steps_from_json(data), None)


def _steps_damage(data) -> str | None:
    """What is wrong with a ``ranks.json`` document (both formats steps_from_json reads), or None."""
    if isinstance(data, dict) and "ranks" not in data and isinstance(data.get("rank_steps"), list):
        ranks = data["rank_steps"]  # the older format: per rank [[batch, compute, rebalance], ...]
        ok = all(isinstance(r, list) for r in ranks) and all(
            isinstance(s, list) and len(s) >= 3 and number(s[0], integer=True) and number(s[1]) and number(s[2])
            for r in ranks
            for s in r
        )
        return None if ranks and ok else "'rank_steps' is not per-rank lists of [batch, compute, rebalance]"
    ranks = data.get("ranks") if isinstance(data, dict) else None
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
        return "no per-rank steps (a 'ranks' list of objects)"
    for columns in ranks:
        names = [c for c in COLUMNS if c in columns]
        if "batch" not in names or "compute" not in names:
            return "a rank without 'batch' and 'compute'"
        values = [columns[c] for c in names]
        if not all(isinstance(v, list) and len(v) == len(values[0]) for v in values):
            return "a rank's columns are not lists of one length"
        for name, column in zip(names, values):
            if not all(number(x, integer=name in _INTEGER_STEP_FIELDS) for x in column):
                return f"{name!r} holds values that are not numbers >= 0"
    return None


def usable_record(record) -> bool:
    """Does a logged :class:`~bno_hvd.training.results.UpdateRecord` have values of the right kind?"""
    sizes = record.batch_sizes
    return (
        number(record.update, integer=True)
        and isinstance(sizes, list)
        and bool(sizes)
        and all(number(b, integer=True) for b in sizes)
        and number(record.global_batch, integer=True)
        and number(record.weight_update_time)
        and number(record.time, -math.inf)
    )


def _simple_name(name) -> bool:
    """A model or strategy name that is one directory below ``runs/`` (no path, no dots alone)."""
    ok = isinstance(name, str) and 0 < len(name) <= 200 and name not in (".", "..")
    return ok and "/" not in name and "\x00" not in name


def read_updates(log_dir: str) -> list[UpdateRecord]:
    """The per-update records a run wrote (a torn or foreign line, or one whose values are of the
    wrong kind, is skipped; see :mod:`bno_hvd.lab.logread`)."""
    out = []
    with open(os.path.join(log_dir, "updates.jsonl"), "rb") as fh:
        for raw in fh:
            try:
                record = UpdateRecord.from_dict(json.loads(raw.decode("utf-8")))
            except (UnicodeDecodeError, ValueError, TypeError, AttributeError, RecursionError):
                continue  # (json.JSONDecodeError is a ValueError, as is an integer of 5,000 digits)
            if usable_record(record):
                out.append(record)
    return out
