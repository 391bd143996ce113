"""What Horovod's ``DistributedSampler`` offers a script, on the :class:`~bno_hvd.library.balancer.Balancer`.

A Horovod script builds its sampler over the world, and calls ``train_sampler.set_epoch(e)`` and
``len(train_sampler)``; the drop-in surface (:mod:`bno_hvd.library.dropin`) puts a Balancer in the
sampler's place, so ``Balancer.for_world`` builds one the way a script builds its sampler, and the
Balancer answers the sampler's calls here.
"""

from __future__ import annotations

import inspect
import os
import sys

from bno_hvd.allocation import Strategy, make_strategy, split_spec
from bno_hvd.allocation.sampler import epoch_share
from bno_hvd.allocation.weighting import scaled_lr
from bno_hvd.common.arguments import check_keys, dataset_length, describe
from bno_hvd.common.errors import UsageError
from bno_hvd.library.sequences import text_split
from bno_hvd.processes.mpienv import arrange_for_shared_cores
from bno_hvd.processes.torchenv import world_control_comm
from bno_hvd.processes.world import leave_together, one_line_errors

OWN = ("self", "comm", "strategy", "dataset_len", "seed")  # the Balancer's arguments for_world sets itself
CONTROL_CALLS = ("Get_rank", "Get_size", "gather", "bcast", "Barrier", "Dup")  # of a ControlComm


class SamplerFace:
    """The ``DistributedSampler`` face of a Balancer (a mixin: it uses the Balancer's
    ``sampler``, ``plan``, ``rank`` and ``strategy``)."""

    @classmethod
    def for_world(
        cls,
        dataset,
        batch_size: int,
        strategy="balanced",
        *,
        global_batch=None,
        seed=0,
        comm=None,
        lengths=None,
        cost=None,
        global_tokens=None,
        **options,
    ) -> Balancer:  # noqa: F821 - the subclass
        """A Balancer over every rank of the job (or ``comm``), the drop-in for Horovod's or torch's
        ``DistributedSampler``: its control plane on a duplicate of ``MPI.COMM_WORLD``, or under
        torchrun on a Gloo group of its own (``bno_hvd.processes.torchenv.world_control_comm``).

        Args:
            dataset: the training set (or its length).
            batch_size: the per-rank base batch B, as Horovod's per-rank batch size (the global
                batch is N*B, or ``global_batch``).
            strategy: a strategy's name (``"balanced"``, ``"equal"``, ``"balanced:deadband=0.1"``,
                ...), built with ``make_strategy(strategy, N, batch_size, global_batch=, seed=)``,
                or a :class:`~bno_hvd.Strategy`.
            global_batch: the global batch, when it is not N*B (with a strategy's name only).
            seed: the sample order, the per-sample augmentation and dropout seeds, and
                ``random``'s draws.
            comm: an mpi4py communicator or a ``TorchComm`` (None: the job's world).
            lengths: for token sequences, one length per sample (its tokens, e.g. its predictions):
                each rank's gradient weight is then its share of the global batch's tokens, so a
                loss that is the mean over the rank's tokens becomes the mean over every token of
                the global batch; a rank's sequences come shortest first.
            cost: with ``lengths``, split each global batch by what its sequences cost instead of
                by their count: ``"tokens"`` or what :func:`~bno_hvd.measure_sequence_cost`
                measured. ``batch_size`` stays the average sequences per rank; a
                :class:`~bno_hvd.Strategy` given here splits shares of work (its sizes in any unit).
            global_tokens: with ``cost``, a global batch of the fewest next sequences that hold this
                many tokens (instead of N*B, or ``global_batch``, sequences).
            **options: the :class:`~bno_hvd.Balancer`'s other arguments (``rebalance_every``,
                ``monitor``, ``max_batch``, ``window``, ``lag``, ...).

        Example::

            hvd.init()
            train_sampler = bno.Balancer.for_world(train_set, 32, "balanced", seed=42)
            train_loader = bno.DataLoader(train_set, sampler=train_sampler)
            len(train_sampler)             # samples this rank reads per epoch, as DistributedSampler's
            text_sampler = bno.Balancer.for_world(seqs, 16, lengths=seqs.lengths, cost=cost, global_tokens=2048)
        """
        one_line_errors()
        leave_together()  # no rank's Horovod may finalize MPI while another still talks on comm (or unwinds)
        length = dataset_length(dataset, "Balancer.for_world's dataset")
        check_keys("Balancer.for_world", options, [p for p in inspect.signature(cls).parameters if p not in OWN])
        if comm is not None and not all(callable(getattr(comm, name, None)) for name in CONTROL_CALLS):
            raise UsageError(
                f"comm must be an mpi4py communicator or a TorchComm (or None: the job's world), got {describe(comm)}"
            )
        if not isinstance(strategy, (str, Strategy)):
            raise UsageError(
                f"strategy must be a strategy's name or a Strategy (make_strategy), got {describe(strategy)}"
            )
        if lengths is not None and "text" in options:
            raise UsageError("give lengths= (and cost=, global_tokens=) or text=TextOptions(...), not both")
        comm = world_control_comm() if comm is None else comm
        _check_horovod_world(comm.Get_size())
        units, text = text_split(
            length, comm.Get_size(), batch_size, global_batch, lengths=lengths, cost=cost, global_tokens=global_tokens
        )
        if text is not None:
            options["text"] = text
        if isinstance(strategy, str) and text is not None and text.shares and split_spec(strategy)[0] == "fixed":
            raise UsageError(
                f"strategy {strategy!r} gives each rank a number of sequences, and cost= splits by work: drop "
                "cost= (lengths= alone splits sequences) or choose another strategy"
            )
        if isinstance(strategy, str):
            strategy = make_strategy(strategy, comm.Get_size(), seed=seed, **units)
        elif global_batch is not None:
            raise UsageError("global_batch= belongs to the strategy: make_strategy(name, N, B, global_batch=G)")
        if text is not None and text.shares:
            _check_split_by_cost(strategy, options)
        note = arrange_for_shared_cores(dict(os.environ))  # on a copy: MPI has started, too late to set it
        if note and comm.Get_rank() == 0:
            print(
                "bno-hvd: note: ranks outnumber this host's cores and OMPI_MCA_mpi_yield_when_idle is not set; "
                "export it (source launch/mpi-env) before horovodrun, or waiting ranks busy-poll the cores",
                file=sys.stderr,
                flush=True,
            )
        # a rank the strategy gives 0 samples sits out once a drop-in takes the balancer (library/sitout.py);
        # a split by cost gives every rank a sequence at least
        options.setdefault("sit_out", False if text is not None and text.shares else None)
        return cls(comm, strategy, length, seed=seed, **options)

    # -- what a DistributedSampler offers (Horovod scripts call these) ---------------------

    def set_epoch(self, epoch: int) -> None:
        """Accepted so that a Horovod script runs unchanged; changes nothing. The stream draws a
        new permutation per epoch by itself (seeded by (seed, epoch)), and one ``for`` over a loader
        is one epoch of it."""

    def __len__(self) -> int:
        """Samples this rank reads per epoch at the newest allocation, ceil(N * n_r / sum(n))
        (``DistributedSampler``'s ceil(N / size) when batches are even)."""
        return epoch_share(self.sampler.dataset_len, self.latest_counts(), self.rank)

    def latest_counts(self) -> list[int]:
        """Every rank's samples at the newest allocation (its sequences when split by cost, which
        the newest allocation's shares would give the next global batch)."""
        latest = self.plan.latest()
        return latest if self.sampler.work is None else self.sampler.counts_at(self.sampler.position, latest)

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


def _check_split_by_cost(strategy, options: dict) -> None:
    if strategy.changes_global_batch:
        raise UsageError(
            f"strategy {strategy.name} changes the global batch, which cost= keeps fixed; drop cost= "
            "(lengths= alone splits sequences) or choose another strategy"
        )
    if options.get("sit_out") is True:
        raise UsageError("sit_out=True: a split by cost gives every rank one sequence at least; drop one of them")


def _check_horovod_world(size: int) -> None:
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized() and hvd.size() != size:
        raise UsageError(
            f"mpi4py sees {size} ranks but Horovod sees {hvd.size()}; "
            "launch with horovodrun --mpi (not --gloo) or mpirun"
        )
