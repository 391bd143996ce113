"""One call that makes a model's batch-dependent layers exact under uneven batches.

N ranks with uneven batches compute exactly the update of one process on the whole global batch
when every layer treats a sample as one process would: dropout draws its mask per global sample
(:mod:`bno_hvd.library.dropout`) and BatchNorm normalises by the global batch's statistics
(:mod:`bno_hvd.library.batchnorm`). Usage::

    model = bno.exact(Net(), balancer)        # dropout and BatchNorm; before the first forward
"""

from __future__ import annotations

from bno_hvd.library.batchnorm import exact_batchnorm, has_batchnorm
from bno_hvd.library.dropout import exact_dropout

__all__ = ["exact", "exact_for_run"]


def exact(model, balancer, *, process_sets=None):
    """:func:`~bno_hvd.exact_batchnorm` and :func:`~bno_hvd.exact_dropout` on ``model``: N ranks
    with uneven batches then compute the update of one process on the whole global batch, with
    dropout and BatchNorm; returns ``model``.

    Args:
        model: the ``nn.Module``, before its first training forward (an optimizer built on its
            parameters before keeps working: the tensors stay the same).
        balancer: the :class:`~bno_hvd.Balancer` whose loader feeds the model.
        process_sets: as ``exact_batchnorm`` takes them (a loop in which a rank may sit out).

    Example::

        train_sampler = bno.Balancer.for_world(train_set, 32)
        train_loader = bno.DataLoader(train_set, sampler=train_sampler)
        model = bno.exact(Net(), train_sampler)   # was model = Net()
    """
    exact_batchnorm(model, balancer, process_sets=process_sets)
    return exact_dropout(model, balancer)


def exact_for_run(model, balancer, *, enabled: bool, capped: bool, process_sets=None) -> str | None:
    """The training command's conversion: dropout masks per global sample (also under micro-batches:
    each pass draws its rows' masks), and a model with BatchNorm gets the global batch's statistics
    (``enabled``: ``--exact-batchnorm``, the default). Returns a note for the user when BatchNorm
    stays per rank although batches are uneven (``capped``: a memory cap splits batches into
    micro-batches, each of which BatchNorm can only normalise by itself)."""
    exact_dropout(model, balancer)
    if not has_batchnorm(model):
        return None
    if not enabled:
        return "--local-batchnorm: each rank's BatchNorm uses its own batch's statistics (not exact)"
    if capped:
        return (
            "BatchNorm under --max-batch/--max-tokens normalises each micro-batch by its own statistics: "
            "uneven batches are not exactly one process's update (drop the cap for exact BatchNorm)"
        )
    exact_batchnorm(model, balancer, process_sets=process_sets)
    return None
