"""``bno.elastic``: the DDP drop-in of a user's script under elastic membership, in the shape of
Horovod's elastic API (``hvd.elastic.TorchState``, ``@hvd.elastic.run``).

Launched by the agent (``bno-hvd elastic -n 4 -- python script.py ...``), each worker keeps one
:class:`State` (the plain model and its optimizer) and calls a function decorated with
:func:`run` that builds one *generation*'s world-dependent parts (the Balancer, the loader, the
DDP model) and trains. The decorator forms each generation's process group
(:mod:`bno_hvd.processes.membership`), gives every rank the state of the first rank that holds the
most committed updates, and calls the function; a failed collective, or a newer generation (a
join, a leave), raises inside the user's loop, and the decorator leaves the world, waits for the
agent's next generation and calls the function again. What training with ``--elastic`` keeps
(:mod:`bno_hvd.training.elastic`) is kept here by the same parts:

- *committed*: an update whose ``optimizer.step()`` this rank took. A global step post-hook,
  registered when the State is made (before any DDP drop-in's, so it runs first), records the
  update in the sample ledger (:mod:`bno_hvd.training.ledger`) before anything collective follows
  it. A failed allreduce raises in the backward (DDP waits for every bucket's future there), so no
  rank steps on one; an allreduce that completed on a rank holds every rank's contribution.
- *the boundary*: as each update starts (the Balancer's ``start_step``, as the loader hands out
  its batch) rank 0 asks the agent's store for a newer generation and tells every rank (one small
  broadcast), so all leave at the same update boundary, and only while an update is left: a change
  that comes after an epoch's last update lets the script evaluate that epoch first, one after the
  job's last update lets the job finish (a worker waiting to join then ends with 0).
- *the stream*: :meth:`State.epochs` sets the generation's Balancer to the ledger's position and
  update count (``resume_stream``), so the loader's next ``for`` goes on from there with the new
  split, and returns the epochs left.

Usage (examples/ddp_elastic.py)::

    state = bno.elastic.State(model, optimizer, log_dir="runs/elastic")
    train(state)

    @bno.elastic.run
    def train(state):
        sampler = bno.Balancer.for_world(train_set, 4, "balanced", global_batch=64, sit_out=False)
        loader = bno.DataLoader(train_set, sampler=sampler)
        ddp = bno.DistributedDataParallel(bno.exact_dropout(state.model, sampler), balancer=sampler)
        for epoch in state.epochs(sampler, 10):
            for data, target in loader: ...
"""

from __future__ import annotations

import functools
import os
import signal

import torch

from bno_hvd.common.errors import UsageError
from bno_hvd.library.ddp import generation_groups, release_generation_groups
from bno_hvd.processes.membership import ID_ENV, STORE_ENV, JobDone, Membership
from bno_hvd.processes.world import one_line_errors
from bno_hvd.training.elastic import MembershipChange, generations, resume_stream
from bno_hvd.training.ledger import Ledger

__all__ = ["State", "run"]


class State:
    """What a worker carries from one generation to the next: ``model`` (the plain module, BatchNorm
    buffers included) and ``optimizer`` (its state: momentum, Adam moments), and the ledger of the
    updates it committed. Make it once, before the function :func:`run` decorates.

    Args:
        model: the plain ``torch.nn.Module`` (each generation wraps it in its DDP drop-in).
        optimizer: the optimizer over ``model``'s parameters.
        log_dir: where rank 0 writes ``ledger.jsonl`` (``bno-hvd ledger check DIR``); None: no file.
        timeout: seconds any collective, and (three times over) the forming of a generation, may take.

    Example::

        state = bno.elastic.State(model, optimizer, log_dir=args.log_dir)
    """

    def __init__(self, model, optimizer, *, log_dir: str | None = None, timeout: float = 30.0):
        from torch.optim.optimizer import register_optimizer_step_post_hook

        one_line_errors()
        if not isinstance(model, torch.nn.Module) or isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise UsageError("bno.elastic.State takes the plain model (each generation wraps it in DDP itself)")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise UsageError(f"bno.elastic.State needs a torch optimizer, got {type(optimizer).__name__}")
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise UsageError(f"bno.elastic.State's timeout is in seconds and > 0, got {timeout!r}")
        self.model, self.optimizer = model, optimizer
        self.log_dir, self.timeout = log_dir, float(timeout)
        self.entries: list[dict] = []  # the updates this rank committed (ledger entries)
        self.started = False  # this worker has trained in a generation (it holds a state)
        self.world = self.membership = self.balancer = self.ledger = None
        self.global_batch = None  # the first generation's: the same in every generation
        self.buffers = _buffers(model)  # BatchNorm's statistics at the last commit (a failed forward moves them)
        self._hook = register_optimizer_step_post_hook(self._stepped)  # before any DDP drop-in's hook

    @property
    def epoch(self) -> int:
        """The epoch (counted from 1) the stream stands in: where the epoch loop goes on."""
        if not self.entries or self.balancer is None:
            return 1
        epoch, _, stop = self.entries[-1]["ranges"][-1]
        return epoch + 1 + (stop == self.balancer.sampler.dataset_len)

    def epochs(self, balancer, last: int) -> range:
        """This generation's Balancer follows the committed updates (stream position, updates done);
        the epochs left of ``1..last``. Collective only through what the Balancer was built with."""
        self._adopt(balancer)
        return range(self.epoch, int(last) + 1)

    # -- inside ----------------------------------------------------------------------------

    def _adopt(self, balancer) -> None:
        from bno_hvd.library.balancer import Balancer

        if self.world is None:
            raise UsageError("State.epochs() belongs inside the function decorated with @bno.elastic.run")
        if not isinstance(balancer, Balancer):
            raise UsageError(f"State.epochs() takes this generation's Balancer, got {type(balancer).__name__}")
        if balancer.sit_out_wanted is not False or balancer.strategy.changes_global_batch:
            raise UsageError(
                "under bno.elastic every rank computes and the global batch is fixed: build the balancer with "
                "sit_out=False and a strategy that keeps the global batch (not bno)"
            )
        self.global_batch = self.global_batch or balancer.strategy.global_batch
        if balancer.strategy.global_batch != self.global_batch:
            raise UsageError(
                f"the global batch is {balancer.strategy.global_batch} here and was {self.global_batch}: pass "
                "global_batch= to Balancer.for_world, so that it does not follow the number of ranks"
            )
        if self.balancer is not None and self.balancer is not balancer:
            self.balancer._step = None  # the last generation's hooks see no step in progress: they do nothing
        self.balancer = balancer
        balancer.before_step = self._boundary
        resume_stream(balancer, self.entries)
        log_dir = self.log_dir if self.world.rank == 0 else None
        sampler = balancer.sampler
        self.ledger = Ledger(log_dir, dataset_len=sampler.dataset_len, seed=sampler.seed, members=self.world.members)
        self.ledger.open(self.entries)
        self.ledger.balancer = balancer
        self.entries = self.ledger.entries  # appended at each commit
        self.started = True

    def _stepped(self, optimizer, args, kwargs) -> None:
        """A step of this state's optimizer: the update is committed."""
        if optimizer is not self.optimizer or self.ledger is None or self.balancer.current_step is None:
            return
        self.ledger.before_compute(self.balancer.current_step)
        self.ledger.commit()
        if self.world.rank == 0:
            self.membership.trained()
        self.buffers = _buffers(self.model)

    def _boundary(self) -> None:
        """An update starts (this generation's Balancer): every rank leaves for a newer generation, if any."""
        comm = self.world.control_comm
        newer = self.membership.latest() if comm.Get_rank() == 0 else None
        newer = comm.bcast(newer, root=0)
        if newer > self.membership.generation:
            raise MembershipChange(newer)

    def _sync(self) -> None:
        """The state of the first rank that holds the most committed updates, on every rank."""
        comm = self.world.control_comm
        counts = comm.allgather(len(self.entries) if self.started else -1)
        if max(counts) < 0:  # the first generation: every worker starts from the script's own model
            self.membership.fresh_start()
            return
        leader = counts.index(max(counts))
        mine = None
        if self.world.rank == leader:
            model = self.model.state_dict()
            model.update((k, v) for k, v in self.buffers.items() if k in model)  # as committed
            mine = (model, self.optimizer.state_dict(), self.entries)
        model, optimizer, entries = comm.bcast(mine, root=leader)
        self.model.load_state_dict(model)  # the leader too: its buffers as committed
        if self.world.rank != leader:
            self.optimizer.load_state_dict(optimizer)
            self.entries = [dict(e) for e in entries]
        self.buffers = _buffers(self.model)
        self.started = True

    def _end_generation(self) -> None:
        # the generation's groups go now (their connections close: a peer waiting on one fails at once):
        # the DDP drop-ins' gradient groups, the Balancer's control plane and the world's
        release_generation_groups()
        comms = [] if self.balancer is None else [self.balancer.control.plane.comm]
        comms += [] if self.world is None else [self.world.control_comm]
        for comm in comms:
            if hasattr(comm, "close"):
                comm.close()
        if self.ledger is not None:
            self.ledger.close()
        self.ledger = self.world = None


def _buffers(model) -> dict:
    return {name: b.detach().clone() for name, b in model.named_buffers()}


def run(func):
    """Decorate the function that trains one generation, ``func(state, *args, **kwargs)``; call it
    once, as the undecorated function. Under the agent (``bno-hvd elastic -- python script.py``) it
    runs ``func`` in every generation this worker belongs to, until ``func`` returns (its result).
    A worker asked to leave (SIGTERM), or one whose join came after the last update, ends with
    exit 0 at that point (``SystemExit(0)``).

    Example::

        @bno.elastic.run
        def train(state, args):
            ...
            for epoch in state.epochs(train_sampler, args.epochs):
                ...
    """

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        one_line_errors()
        if not isinstance(state, State):
            raise UsageError(f"a function of @bno.elastic.run takes the bno.elastic.State first, got {state!r}")
        if STORE_ENV not in os.environ or ID_ENV not in os.environ:
            raise UsageError("@bno.elastic.run needs the elastic agent: bno-hvd elastic -n N -- python script.py")
        state.membership = Membership(os.environ[STORE_ENV], int(os.environ[ID_ENV]))
        signal.signal(signal.SIGTERM, lambda signum, frame: state.membership.ask_to_leave())
        state.membership.ready()

        def attempt(world):
            state.world = world
            state._sync()
            generation_groups(True)  # the DDP drop-ins of func: gradient groups that go with the generation
            try:
                result = func(state, *args, **kwargs)
            finally:
                generation_groups(False)
            state._end_generation()
            return result

        try:
            return generations(state.membership, state.timeout, attempt, lambda err: state._end_generation())
        except JobDone:  # nothing left to do: the others finished while it waited to join, or it left
            raise SystemExit(0) from None

    return wrapper
