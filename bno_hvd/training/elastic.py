"""``bno-hvd train --elastic``: a run that survives ranks leaving and joining, without losing or
repeating a sample, and with the update it would have made anyway.

Built only when the flag is set; the loop in :mod:`bno_hvd.training.loop` stays the plain algorithm.
The run is a sequence of *generations* (:mod:`bno_hvd.processes.membership`). Within one, the
loop trains as usual, with one hook (:class:`Boundary`): at the start of each update rank 0 asks
the agent's store whether a newer generation exists and tells every rank (one small broadcast),
so all ranks leave at the same update boundary for a join or a leave. A rank that dies instead
makes a collective fail on the others; they then wait for the agent's next generation.

Either way each survivor keeps what it holds: the model, the optimizer and the ledger of the
updates it has committed (an update whose optimizer step this rank took is committed, even when a
collective after it failed). In the next generation the ranks compare how many updates they
hold; the first that holds the most sends its state to all (joiners included), so an update is
either finished everywhere (someone stepped: every rank takes its parameters) or redone from the
same parameters (nobody stepped): never half-applied. The stream position follows from the
ledger, and the new split is the strategy's for the new number of ranks over the *same* global
batch, so the sequence of global batches, and the updates, are those of one process.
"""

from __future__ import annotations

import signal
import sys

from bno_hvd.allocation.sampler import Position
from bno_hvd.common.errors import TrainingError, UsageError
from bno_hvd.processes.membership import JobDone, Membership, leave_world
from bno_hvd.training.hooks import Hook

FIRST_WAIT_S = 600.0  # the agent publishes generation 0 once all its workers have started


class MembershipChange(Exception):
    """A newer generation was published: every rank leaves this one at the same update boundary."""


class Boundary(Hook):
    """At each update's start: rank 0 looks for a newer generation, every rank learns it; and it
    notes whether this rank's optimizer took the update's step (the update is then committed)."""

    def __init__(self, membership: Membership, comm):
        self.membership, self.comm = membership, comm
        self.stepped = False
        self.ledger = None

    def start(self, run) -> None:
        self.ledger = run.ledger
        inner = getattr(run.optimizer, "optimizer", run.optimizer)
        inner.register_step_post_hook(self._stepped)

    def _stepped(self, optimizer, args, kwargs) -> None:
        self.stepped = True

    def before_compute(self, step) -> None:
        self.stepped = False
        newer = self.membership.latest() if self.comm.Get_rank() == 0 else None
        newer = self.comm.bcast(newer, root=0)
        if newer > self.membership.generation:
            raise MembershipChange(newer)

    def after_update(self, record, stats) -> None:
        self.stepped = False  # the ledger hook (before this one) committed it
        if self.comm.Get_rank() == 0:
            self.membership.trained()

    def salvage(self) -> None:
        """After a failure: an update whose step this rank took is committed here too."""
        if self.stepped and self.ledger is not None:
            self.ledger.commit()
        self.stepped = False


class Held:
    """What a rank carries from one generation to the next (its committed state)."""

    def __init__(self, model, optimizer, entries):
        self.model = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.optimizer = optimizer.state_dict()
        self.entries = list(entries)


def restore_from_peers(world, cfg, held: Held | None, membership: Membership):
    """``build_run``'s restore: the state of the first rank that holds the most updates, on every rank."""

    def restore(model, optimizer, balancer, ledger):
        comm = world.control_comm
        counts = comm.allgather(-1 if held is None else len(held.entries))
        if max(counts) < 0:  # the first generation: a fresh run, or --resume's checkpoint
            membership.fresh_start()
            if not cfg.resume:
                return None
            from bno_hvd.training.checkpoint import restore_training_state

            return restore_training_state(cfg, comm, model, optimizer, balancer, ledger)
        leader = counts.index(max(counts))
        state = comm.bcast(held if world.rank == leader else None, root=leader)
        model.load_state_dict(state.model)
        optimizer.load_state_dict(state.optimizer)
        ledger.resumed = state.entries
        return resume_stream(balancer, state.entries)

    return restore


def resume_stream(balancer, entries: list[dict]) -> int:
    """Set ``balancer`` (its stream position and updates done) to follow the updates of ``entries``
    (ledger entries), splitting from there by its strategy's newest allocation; the next update's index."""
    update = entries[-1]["update"] + 1 if entries else 0
    start = position_after(entries, balancer.sampler.dataset_len)
    sampler = balancer.sampler
    sampler.load_state_dict(
        {"seed": sampler.seed, "epoch": start.epoch, "offset": start.offset, "dataset_len": sampler.dataset_len}
    )
    plan = balancer.plan
    balancer.control.load_state_dict({"plan": {"lag": plan.lag, "done": update, "changes": [[update, plan.latest()]]}})
    return update


def position_after(entries: list[dict], dataset_len: int) -> Position:
    """Where the stream stands after the updates of ``entries`` (ledger entries)."""
    if not entries:
        return Position(0, 0)
    epoch, _, stop = entries[-1]["ranges"][-1]
    return Position(epoch, stop).advanced(0, dataset_len)


def run_elastic(cfg, membership: Membership, *, out=sys.stdout, plugin=None):
    """Train per ``cfg`` as worker ``membership.id`` of an elastic job, generation after generation;
    the run's result, or None for a worker that left (SIGTERM) before the end or whose join came
    after the training's last update."""
    signal.signal(signal.SIGTERM, lambda signum, frame: membership.ask_to_leave())
    _warm_up(cfg)
    membership.ready()
    try:
        return _generations(cfg, membership, out, plugin)
    except JobDone:  # nothing left to do: the others finished while it waited to join, or it left
        return None


def _generations(cfg, membership: Membership, out, plugin):
    from bno_hvd.training.loop import Training

    held = training = boundary = None

    def attempt(world):
        nonlocal training, boundary
        boundary = Boundary(membership, world.control_comm)
        restore = restore_from_peers(world, cfg, held, membership)
        training = Training(cfg, world, out=out, plugin=plugin, restore=restore, extra_hooks=[boundary])
        training.advance()
        result, training = training.finish(), None
        return result

    def failed(err):
        nonlocal held, training, boundary
        boundary.salvage()
        held = _keep(training, held)
        _close(training)
        training = boundary = None

    return generations(membership, cfg.elastic_timeout, attempt, failed)


def generations(membership: Membership, timeout: float, attempt, failed):
    """Form each generation this worker belongs to and call ``attempt(world)`` in it: its result,
    once it returns (rank 0 then writes ``done``). A failure that is not the run's own (a peer
    died, a newer generation: not a TrainingError or UsageError) calls ``failed(err)``, drops the
    generation's groups and waits for the agent's next. Raises :class:`JobDone` for a worker with
    nothing left to do (the training finished while it waited to join, or it was asked to leave).
    The loop of ``train --elastic`` and of a script's ``@bno.elastic.run``."""
    gen, member = -1, False
    while True:  # the first generation waits for every worker to start (imports, under load)
        gen, ids = membership.wait_newer(gen, timeout if member else FIRST_WAIT_S)
        if membership.id not in ids:
            if membership.leaving:
                raise JobDone()
            if member:  # it did not arrive at a formation in time (slow, paused): it joins again
                member = False
                membership.ready()
            continue  # a joiner sees the generations before the one that admits it
        member = True
        try:
            world = membership.world(gen, ids, timeout=timeout)
        except RuntimeError:  # a member died while it formed, or a timeout under load: the agent publishes the next
            leave_world()
            membership.reform(gen)
            continue
        if world is None:  # a newer generation came before every member arrived, or one did not: the next
            membership.reform(gen)
            continue
        try:
            result = attempt(world)
            if world.rank == 0:
                membership.finish()  # a joiner still waiting ends (with 0)
            return result
        except Exception as err:  # noqa: BLE001 - a peer that died fails a collective in many ways
            if isinstance(err, (TrainingError, UsageError)):
                raise
            failure = err
        world = None
        failed(failure)
        _release(failure)
        gen = _next_after(membership, gen, failure, timeout)


def _warm_up(cfg) -> None:
    """Pay a process's first build (imports, the data set read from disk: about 2 s alone, several
    under load) before it says it is ready, so a joiner does not keep a generation's first
    collective waiting past --elastic-timeout. Best effort: the real build reports any error."""
    from bno_hvd.training.components import prepare

    try:
        prepare(cfg, 1, 2)
    except Exception:  # noqa: BLE001 - a warm-up only
        pass


def _keep(training, held):
    if training is None or training.run.ledger is None:
        return held
    run = training.run
    return Held(run.model, run.optimizer, run.ledger.entries)


def _release(failure: BaseException) -> None:
    """Close this generation's Gloo connections now, not when Python gets round to it: a peer still
    waiting on this rank in a collective then fails at once ("connection closed") instead of at
    --elastic-timeout. The failure's frames hold the groups (the collective that failed): dropped."""
    import gc

    from bno_hvd.library.ddp import release_kept_groups

    seen = [failure]
    while seen[-1] is not None and len(seen) < 10:
        seen[-1].__traceback__ = None
        seen.append(seen[-1].__cause__ or seen[-1].__context__)
    leave_world()
    gc.collect()
    release_kept_groups()  # the groups a DDP drop-in keeps, for models now gone (a script's)


def _close(training) -> None:
    if training is None:
        return
    try:
        training.close()
    except Exception:  # noqa: BLE001 - a broken generation's logs and threads: best effort
        pass


def _next_after(membership: Membership, gen: int, err: BaseException, timeout: float) -> int:
    """Where the next generation starts looking: ``gen`` (wait for a newer one). A failure that no
    new generation explains within ``timeout`` is this rank's own: it is raised."""
    if isinstance(err, MembershipChange):
        return gen
    try:
        membership.wait_newer(gen, timeout)
    except TrainingError:
        raise err from None
    return gen
