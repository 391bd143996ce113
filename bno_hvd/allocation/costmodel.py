"""What a sequence costs to compute: per-sequence, per-token and per-squared-length terms (pure).

A transformer's forward and backward pass over a micro-batch of ``n`` sequences padded to the
longest, ``L``, costs about ``n * (s + t * L + q * L^2)`` seconds: ``s`` per sequence (launching
kernels, the loss), ``t`` per token (embeddings, the MLP, the projections: linear in L), ``q`` per
squared length (attention's scores: L x L per head). :func:`fit_sequence_cost` fits the three
terms, plus a fixed cost per pass, to measured passes (a sweep of lengths at start-up,
:mod:`bno_hvd.training.calibrate`) by non-negative least squares, and reports the fit's relative
error on every point of the sweep; :func:`fit_warning` says when that error is large
(:data:`FIT_ERROR_LIMIT`) at some length, since the split by cost then follows a wrong model.

The allocation then counts *work*: a sequence's cost divided by the mean cost of a training
sequence, in thousandths (:data:`UNITS`): 1000 is an average sequence. The strategies split a
global batch's work as they split samples, and the length-aware sampler
(:mod:`bno_hvd.allocation.partition`) fills each rank's share of it.

Usage::

    cost, fixed, errors = fit_sequence_cost(rows)          # rows: (n, L, seconds) of measured passes
    work = work_per_sequence(lengths, cost)                # milli-units per sequence, mean 1000
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

UNITS = 1000  # work of an average training sequence
FIT_ERROR_LIMIT = 0.2  # a fit off by more than this at some length of the sweep gets a note


@dataclass(frozen=True)
class SequenceCost:
    """Seconds of one sequence of length L in a pass: ``per_sequence + per_token L + per_squared L^2``."""

    per_sequence: float
    per_token: float
    per_squared: float

    def of(self, lengths) -> np.ndarray:
        L = np.asarray(lengths, dtype=float)
        return self.per_sequence + self.per_token * L + self.per_squared * L * L

    def pass_seconds(self, n, L) -> np.ndarray:
        """A pass over ``n`` sequences padded to length ``L`` (fixed cost not included)."""
        return np.asarray(n, dtype=float) * self.of(L)

    def to_dict(self) -> dict:
        return {"per_sequence": self.per_sequence, "per_token": self.per_token, "per_squared": self.per_squared}


TOKENS = SequenceCost(0.0, 1.0, 0.0)  # --allocate-by tokens: a sequence costs its length


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``argmin |x b - y|`` over ``b >= 0`` for a few columns: every subset of columns, the best
    non-negative unconstrained solution (exact for the 4 columns used here)."""
    best, best_err = np.zeros(x.shape[1]), float(y @ y)
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            sub = x[:, cols]
            if np.linalg.matrix_rank(sub) < k:
                continue
            coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if (coef < 0).any():
                continue
            err = float(np.sum((sub @ coef - y) ** 2))
            if err < best_err:
                best, best_err = np.zeros(x.shape[1]), err
                best[list(cols)] = coef
    return best


def fit_sequence_cost(rows) -> tuple[SequenceCost, float, list[float]]:
    """Fit ``seconds = fixed + n * (s + t L + q L^2)`` to measured passes ``(n, L, seconds)``.

    Returns the per-sequence cost, the fixed cost of a pass, and the relative error of the fit
    at every row (prediction / measured - 1). Noisy rows can only make terms 0, never negative."""
    rows = [(float(n), float(L), float(t)) for n, L, t in rows if n > 0 and L > 0 and t > 0]
    if len(rows) < 2:
        raise ValueError("fit_sequence_cost needs at least 2 measured passes")
    n, L, t = (np.array(c) for c in zip(*rows))
    # scale by the measured time: the fit minimises relative errors, so short passes count too
    x = np.column_stack([np.ones_like(n), n, n * L, n * L * L]) / t[:, None]
    fixed, s, per_token, q = nonnegative_lstsq(x, np.ones_like(t))
    cost = SequenceCost(float(s), float(per_token), float(q))
    predicted = fixed + cost.pass_seconds(n, L)
    return cost, float(fixed), (predicted / t - 1.0).tolist()


def fit_warning(rows, errors, limit: float = FIT_ERROR_LIMIT) -> str | None:
    """One line when :func:`fit_sequence_cost`'s ``errors`` on ``rows`` exceed ``limit`` (relative)
    at some length of the sweep, naming the worst; None when the fit holds everywhere."""
    used = [L for n, L, t in rows if n > 0 and L > 0 and t > 0]  # the rows the fit used, in order
    worst: dict = {}
    for L, e in zip(used, errors):
        worst[L] = max(worst.get(L, 0.0), abs(e))
    bad = {L: e for L, e in worst.items() if e > limit}
    if not bad:
        return None
    L = max(bad, key=bad.get)
    return (
        f"the cost model is off by {bad[L]:.1%} at length {L:g} (more than {limit:.0%} at {len(bad)} of the "
        f"sweep's {len(worst)} lengths), so the split by cost follows a wrong model: another process probably "
        "shared rank 0's core while it measured; rerun when the machine is quieter, or use --allocate-by tokens"
    )


def work_per_sequence(lengths, cost: SequenceCost) -> np.ndarray:
    """Each sequence's work in :data:`UNITS` of the mean training sequence's cost."""
    c = cost.of(lengths)
    mean = float(c.mean()) if len(c) else 1.0
    if not mean > 0:
        raise ValueError("the cost model gives every sequence zero cost")
    return c * (UNITS / mean)
