"""What Horovod's ``DistributedSampler`` offers a script, on the :class:`~bno_hvd.library.balancer.Balancer`.

A Horovod script calls ``train_sampler.set_epoch(e)`` and ``len(train_sampler)``; the drop-in
surface (:mod:`bno_hvd.library.dropin`) puts a Balancer in the sampler's place, so the Balancer
answers them here, and ``Balancer.for_world`` builds one the way a script builds its sampler.
"""

from __future__ import annotations

from bno_hvd.allocation.sampler import epoch_share
from bno_hvd.allocation.weighting import scaled_lr
from bno_hvd.common.errors import UsageError


class SamplerFace:
    """The ``DistributedSampler`` face of a Balancer (a mixin: it uses the Balancer's
    ``sampler``, ``plan``, ``rank`` and ``strategy``)."""

    @classmethod
    def for_world(cls, dataset, batch_size: int, strategy="balanced", **options) -> Balancer:  # noqa: F821 - the subclass
        """A Balancer over every rank of ``MPI.COMM_WORLD`` (a duplicate of it), the drop-in for
        Horovod's ``DistributedSampler``: see :func:`bno_hvd.library.dropin.world_balancer`."""
        from bno_hvd.library.dropin import world_balancer

        return world_balancer(cls, dataset, batch_size, strategy, **options)

    # -- what a DistributedSampler offers (Horovod scripts call these) ---------------------

    def set_epoch(self, epoch: int) -> None:
        """Accepted so that a Horovod script runs unchanged; changes nothing. The stream draws a
        new permutation per epoch by itself (seeded by (seed, epoch)), and one ``for`` over a loader
        is one epoch of it."""

    def __len__(self) -> int:
        """Samples this rank reads per epoch at the newest allocation, ceil(N * n_r / sum(n))
        (``DistributedSampler``'s ceil(N / size) when batches are even)."""
        return epoch_share(self.sampler.dataset_len, self.plan.latest(), self.rank)

    def __iter__(self):
        raise UsageError(
            "the balancer is not a torch sampler: build the loader with "
            "bno_hvd.DataLoader(dataset, sampler=balancer, ...) or balancer.loader(dataset, ...)"
        )

    def lr_scale(self, rule: str = "linear") -> float:
        """What replaces Horovod's ``hvd.size()`` in ``lr * hvd.size()``: the global batch over the
        per-rank base batch B (Goyal et al.'s linear rule; 1 with ``rule='none'``). It is
        ``hvd.size()`` when the global batch is N*B, the default. A changing global batch
        (``bno``) is followed per update by :func:`bno_hvd.DistributedOptimizer`."""
        return scaled_lr(1.0, self.strategy.global_batch, 1, self.strategy.base_batch_size, rule)
