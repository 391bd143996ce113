"""The paper's evaluation as pure arithmetic over logged runs: averages per block of updates
(Figures 3-7), time-to-accuracy, and the rows of the CSV files. No MPI, no clock, no files.

Inputs are what ``run_training`` logs on rank 0:

- ``records``: :class:`~bno_hvd.training.results.UpdateRecord` per update (``update``,
  ``weight_update_time`` in s, ``global_batch``, ``time`` = training seconds since the start,
  measured after the update; periodic evaluation is not counted);
- ``evals``: ``[{"update", "samples", "time", "accuracy"}, ...]`` from ``--eval-every``.

Usage::

    blocks = block_averages(records, every=100)      # one BlockAverage per 100 updates
    hit = time_to_accuracy(evals, target=0.85)        # AccuracyHit or None
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bno_hvd.training.results import UpdateRecord


@dataclass(frozen=True)
class BlockAverage:
    """Updates ``first_update..last_update`` (inclusive) of one run."""

    block: int  # 1-based, like the paper's x axis (x100 updates)
    first_update: int
    last_update: int
    updates: int  # < every only for a last, partial block
    mean_weight_update_time: float  # seconds
    samples_per_s: float  # samples / training seconds spent in the block
    mean_global_batch: float


@dataclass(frozen=True)
class AccuracyHit:
    """The first evaluation at or above the target."""

    time: float  # training seconds
    update: int
    samples: int
    accuracy: float


def block_averages(records: list[UpdateRecord], every: int) -> list[BlockAverage]:
    """Average ``records`` over consecutive blocks of ``every`` updates (the last may be partial).

    A block's throughput is its samples over the training time between the end of the previous
    block and the end of its last update (for the first block: from the start of its first update).
    """
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    out = []
    for k, lo in enumerate(range(0, len(records), every)):
        block = records[lo : lo + every]
        start = records[lo - 1].time if lo > 0 else block[0].time - block[0].weight_update_time
        seconds = block[-1].time - start
        samples = sum(r.global_batch for r in block)
        out.append(
            BlockAverage(
                block=k + 1,
                first_update=block[0].update,
                last_update=block[-1].update,
                updates=len(block),
                mean_weight_update_time=sum(r.weight_update_time for r in block) / len(block),
                samples_per_s=samples / seconds if seconds > 0 else math.nan,
                mean_global_batch=samples / len(block),
            )
        )
    return out


def with_final_eval(evals: list[dict], result: dict) -> list[dict]:
    """``evals`` plus the end-of-run evaluation from ``result`` (if it is not already the last)."""
    out = list(evals)
    if result.get("test_accuracy") is None:
        return out
    if out and out[-1]["update"] == result["updates"]:
        return out
    out.append(
        {
            "update": result["updates"],
            "samples": result["samples"],
            "time": result["wall_seconds"],
            "accuracy": result["test_accuracy"],
        }
    )
    return out


def time_to_accuracy(evals: list[dict], target: float) -> AccuracyHit | None:
    """The first evaluation whose accuracy is >= ``target`` (evals in update order), or None."""
    for e in evals:
        if e["accuracy"] >= target:
            return AccuracyHit(float(e["time"]), int(e["update"]), int(e["samples"]), float(e["accuracy"]))
    return None


def accuracy_at_samples(evals: list[dict], samples: int) -> float | None:
    """Accuracy of the last evaluation made after at most ``samples`` samples (None if none)."""
    seen = [e for e in evals if e["samples"] <= samples]
    return float(seen[-1]["accuracy"]) if seen else None


# settings that must match for a second job to add its runs to an experiment directory
_SAME_SETTINGS = ("updates", "average_every", "eval_every", "target_accuracy", "ranks")
_PER_RUN_CONFIG = ("model", "strategy", "log_dir", "progress")


def merge_experiment(old: dict | None, new: dict) -> dict:
    """``experiment.json`` after a job: a job with the same settings and training flags adds its
    models and strategies to the earlier ones (so large models can run as separate jobs);
    anything else starts a new experiment. ``command`` accumulates in ``commands``."""

    def flags(meta):
        return {k: v for k, v in (meta.get("config") or {}).items() if k not in _PER_RUN_CONFIG}

    same = bool(old) and all(old.get(k) == new.get(k) for k in _SAME_SETTINGS) and flags(old) == flags(new)

    def commands(meta):
        return list(meta.get("commands", [meta["command"]] if "command" in meta else []))

    if not same:
        return dict({k: v for k, v in new.items() if k != "command"}, commands=commands(new))
    return dict(
        {k: v for k, v in old.items() if k != "command"},
        models=list(dict.fromkeys(old["models"] + new["models"])),
        strategies=list(dict.fromkeys(old["strategies"] + new["strategies"])),
        commands=commands(old) + commands(new),
    )


AVERAGE_COLUMNS = (
    "model",
    "strategy",
    "block",
    "first_update",
    "last_update",
    "updates",
    "mean_weight_update_time_s",
    "samples_per_s",
    "mean_global_batch",
    "emulation",
)


def average_rows(model: str, strategy: str, blocks: list[BlockAverage], emulation: str) -> list[list]:
    """Rows of ``averages.csv`` (columns :data:`AVERAGE_COLUMNS`)."""
    return [
        [
            model,
            strategy,
            b.block,
            b.first_update,
            b.last_update,
            b.updates,
            b.mean_weight_update_time,
            b.samples_per_s,
            b.mean_global_batch,
            emulation,
        ]
        for b in blocks
    ]


RUN_FIGURES = ("compute_balance", "compute_balance_of_means", "outside_compute_share")  # result.json, as bench
SUMMARY_COLUMNS = (
    "model",
    "strategy",
    "status",
    "ranks",
    "updates",
    "samples",
    "train_seconds",
    "mean_weight_update_time_s",
    "samples_per_s",
    *RUN_FIGURES,
    "final_accuracy",
    "target_accuracy",
    "time_to_accuracy_s",
    "update_to_accuracy",
    "samples_to_accuracy",
    "final_batch_sizes",
    "emulation",
)


def summary_row(
    model: str,
    strategy: str,
    records: list[UpdateRecord],
    result: dict | None,
    evals: list[dict],
    target: float | None,
    ranks: int,
    emulation: str,
) -> dict:
    """One run's line of ``summary.csv``/``summary.json`` (None where a value does not exist)."""
    hit = time_to_accuracy(evals, target) if target is not None else None
    samples = sum(r.global_batch for r in records)
    status = (
        "ok"
        if result
        else f"incomplete: stopped after {len(records)} updates"
        if records
        else "failed before its first update"
    )
    row = {
        "model": model,
        "strategy": strategy,
        "status": status,
        "ranks": ranks,
        "updates": len(records),
        "samples": samples,
        "train_seconds": result["wall_seconds"] if result else (records[-1].time if records else None),
        "mean_weight_update_time_s": (sum(r.weight_update_time for r in records) / len(records) if records else None),
        "samples_per_s": None,
        # (older result.json files have none of these: None)
        **{key: result.get(key) if result else None for key in RUN_FIGURES},
        "final_accuracy": result.get("test_accuracy") if result else None,
        "target_accuracy": target,
        "time_to_accuracy_s": hit.time if hit else None,
        "update_to_accuracy": hit.update if hit else None,
        "samples_to_accuracy": hit.samples if hit else None,
        "final_batch_sizes": list(records[-1].batch_sizes) if records else None,
        "emulation": emulation,
    }
    if row["train_seconds"]:
        row["samples_per_s"] = samples / row["train_seconds"]
    return row


def csv_cell(value) -> str:
    """Lists as ``a;b;c``, floats with 6 significant digits, None as empty."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ";".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
