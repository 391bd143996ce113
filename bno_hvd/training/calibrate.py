"""The cost of a sequence on this model, measured at start-up: a sweep of lengths.

Rank 0 times forward and backward passes of random token batches at lengths from 8 to
``--max-seq-len`` (at each length two batch sizes, so that a pass's fixed cost and a sequence's
cost can be told apart), before the optimizer is wrapped for Horovod (no allreduce runs), while
the other ranks wait for its result: ranks that share cores would otherwise time each other
(measured with all 4 ranks of this 2-core machine sweeping at once: median error 29%; one
process alone: 2-6%). Every rank fits the same :class:`~bno_hvd.allocation.costmodel.SequenceCost` from
rank 0's rows. That is the *shape* of the cost (what a length costs relative to another); how
fast each rank is, ``balanced`` fits from its measured steps. Rank 0 prints the fit and its error
on the sweep; ``run.json`` keeps both (``cost_model``).

Usage (what :func:`bno_hvd.training.components.build_run` does)::

    model_cost = calibrate(comm, model, vocab_size, max_seq_len)
"""

from __future__ import annotations

import statistics

from bno_hvd.allocation.costmodel import fit_sequence_cost
from bno_hvd.library.sequences import measure  # the sweep (also behind bno.measure_sequence_cost)

_MEASURED: dict = {}  # one measurement per model shape and job: a bench's runs share it


def calibrate(comm, model, vocab_size: int, max_seq_len: int, *, reuse: bool = True) -> dict:
    """Collective: the fitted cost model (``cost``, ``fixed_seconds``, ``sweep`` rows, relative ``errors``).

    With ``reuse``, a later call for the same model shape in the same job returns the first
    measurement (every rank made the same calls, so they agree): the runs of one ``bench`` then
    split, and emulate, by the same cost instead of each by its own noisy measurement."""
    p = next(model.parameters())
    key = (type(model).__name__, sum(q.numel() for q in model.parameters()), str(p.dtype), vocab_size, max_seq_len)
    key += (comm.Get_size(),)
    if reuse and key in _MEASURED:
        return _MEASURED[key]
    rows = comm.bcast(measure(model, vocab_size, max_seq_len) if comm.Get_rank() == 0 else None, root=0)
    cost, fixed, errors = fit_sequence_cost(rows)
    _MEASURED[key] = {"cost": cost, "fixed_seconds": fixed, "sweep": rows, "errors": errors}
    return _MEASURED[key]


def describe(model_cost: dict) -> str:
    """One line: the fitted terms and the fit's error on the sweep."""
    c, errs = model_cost["cost"], [abs(e) for e in model_cost["errors"]]
    lengths = sorted({L for _, L, _ in model_cost["sweep"]})
    return (
        f"cost of a pass (sweep of lengths {lengths[0]}..{lengths[-1]}): {model_cost['fixed_seconds'] * 1e3:.3f} ms "
        f"+ per sequence {c.per_sequence * 1e3:.4f} ms + per token {c.per_token * 1e6:.3f} us + per squared length "
        f"{c.per_squared * 1e9:.3f} ns; fit error median {statistics.median(errs):.1%}, max {max(errs):.1%}"
    )
