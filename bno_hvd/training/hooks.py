"""Optional behaviour that plugs into the training loop instead of being woven into it.

TensorBoard (:mod:`bno_hvd.training.tensorboard`) is a :class:`Hook` of the training application, built only
when its flag is set. The lab's behaviour - emulated device speeds, REAL CPU quotas, injected
faults - enters a run the same way, through a :class:`Plugin` that whoever starts the run passes
in (``bno-hvd train`` and the suites pass :func:`bno_hvd.lab.plugin.lab_plugin`): the training
application never imports the lab. A plain run has no hook, and the loop in :mod:`bno_hvd.training.loop` reads as
the plain algorithm.

Where the loop calls them, per update::

    step = balancer.start_step(batch)   # compute timer starts
    hooks.before_compute(step)          # e.g. the emulated wait, a kill
    loss = hooks.loss(loss, step)       # e.g. a NaN
    hooks.after_compute(step)           # compute timer stops right after
    ...                                 # allreduce, optimizer step
    hooks.after_update(record, stats)   # rank 0 has a record, the others None

and ``report(report, update)`` is applied to what this rank tells rank 0 at a rebalance.
``start`` runs once before the first update (every rank, collectively), ``finish`` after the
last (collectively; may return warnings for the user), ``close`` always, also after a failure;
``suspend``/``resume`` around the time other runs of the same job train (``bench --rounds``).
"""

from __future__ import annotations

NO_HETEROGENEITY = "no emulation: real ranks of this machine"  # the label of a run no plugin changes


class Hook:
    """Base: every method does nothing. Subclasses override what they need."""

    def start(self, run) -> None:
        """Before the first update (``run`` is the :class:`bno_hvd.training.components.Run`)."""

    def before_compute(self, step) -> None:
        """Right after ``start_step``: counted as compute."""

    def loss(self, loss, step):
        """This rank's mean loss of the step, before weighting and backward."""
        return loss

    def after_compute(self, step) -> None:
        """Right before ``end_compute``: counted as compute."""

    def report(self, report, update: int):
        """What this rank sends rank 0 at a rebalance (a :class:`bno_hvd.library.control.plane.RankReport`)."""
        return report

    def after_update(self, record, stats) -> None:
        """After an update: ``record`` is rank 0's :class:`UpdateRecord` (None elsewhere)."""

    def finish(self, comm) -> list[str]:
        """After the last update (collective over ``comm``); warnings for the user, on rank 0."""
        return []

    def suspend(self) -> None:
        """Another run of the same job trains now (``bench --rounds``): step aside until :meth:`resume`."""

    def resume(self) -> None:
        """This run trains again."""

    def close(self) -> None:
        """Always, also when the run fails: undo what ``start`` set up."""


class Hooks(Hook):
    """Several hooks called in order (``close`` in reverse order, and every one of them)."""

    def __init__(self, hooks=()):
        self.hooks = list(hooks)

    def __bool__(self) -> bool:
        return bool(self.hooks)

    def start(self, run):
        for h in self.hooks:
            h.start(run)

    def before_compute(self, step):
        for h in self.hooks:
            h.before_compute(step)

    def loss(self, loss, step):
        for h in self.hooks:
            loss = h.loss(loss, step)
        return loss

    def after_compute(self, step):
        for h in self.hooks:
            h.after_compute(step)

    def report(self, report, update):
        for h in self.hooks:
            report = h.report(report, update)
        return report

    def after_update(self, record, stats):
        for h in self.hooks:
            h.after_update(record, stats)

    def finish(self, comm):
        return [w for h in self.hooks for w in h.finish(comm)]

    def suspend(self):
        for h in reversed(self.hooks):
            h.suspend()

    def resume(self):
        for h in self.hooks:
            h.resume()

    def close(self):
        errors = []
        for h in reversed(self.hooks):
            try:
                h.close()
            except Exception as err:  # noqa: BLE001 - every hook gets to clean up
                errors.append(err)
        if errors:
            raise errors[0]


class Plugin:
    """Behaviour from outside the production path, entering one run: its hooks, and what it says
    about the run (``description``: what makes its ranks differ, stored in ``run.json``; ``label``:
    the one line shown with its results, EMULATED or REAL).

    Built on every rank before the first collective by a factory ``factory(cfg, n_ranks)`` passed
    to :func:`bno_hvd.training.components.build_run` (it may raise :class:`UsageError`; the ranks
    agree on the outcome). This base class adds nothing."""

    description: dict = {}
    label: str = NO_HETEROGENEITY

    def hooks(self, rank: int) -> list[Hook]:
        """This rank's hooks, in the order the loop calls them."""
        return []
