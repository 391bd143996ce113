"""Who is in an elastic job (``--elastic``), and the torch.distributed world of each generation.

The elastic agent (:mod:`bno_hvd.processes.elasticagent`) hosts a ``TCPStore`` and is the one
authority on membership: it starts the workers, sees at once when one ends (its child), and
publishes *generations*: ``gen`` holds the newest number, ``gen/<n>`` the sorted worker ids of
generation ``n``. A worker's rank in a generation is its id's place in that list (the oldest
surviving worker is rank 0). Workers write ``ready/<id>`` once started and ``leave/<id>`` when
asked to leave (SIGTERM); the agent answers both with a new generation. A generation that did
not form (its group's rendezvous timed out, under load, with no member dead) is asked again
(``reform/<n>``): the agent publishes the members that arrived as the next generation. Rank 0 writes
``done`` when the training has finished: a worker still waiting for a generation then ends with 0.

Each generation is a torch.distributed job of its own: a Gloo default group whose store keys are
prefixed by the generation. Its members first write their arrival (``form<n>/here/<id>``) and
wait for each other; a newer generation published before all arrived (a member died meanwhile)
makes them skip this one, decided once for all by a compare-and-set of ``form<n>/fate``, so no
group waits for a dead member. Survivors are never restarted: the group is destroyed and made
again in the same process.

Usage (a worker; the CLI reads the address and id from the agent's environment)::

    members = Membership("127.0.0.1:29400", worker_id=2).ready()
    gen, ids = members.wait_newer(-1, timeout=60)
    world = members.world(gen, ids, timeout=30)      # a bno_hvd.processes.world.World
"""

from __future__ import annotations

import datetime
import json
import time

from bno_hvd.common.errors import TrainingError

FORMING_FACTOR = 3  # every member arrives within 3 x --elastic-timeout (they leave the last generation by 1 x)
STORE_ENV, ID_ENV = "BNO_ELASTIC_STORE", "BNO_ELASTIC_ID"  # set by the agent for its workers


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


class JobDone(Exception):
    """This worker has nothing left to do and ends with 0: rank 0 of the last generation finished
    the training (``done``) while it waited to join, or it was asked to leave (SIGTERM) and the
    agent published a generation without it."""


class Membership:
    """A worker's view of the elastic job (its store connection and its own id)."""

    def __init__(self, address: str, worker_id: int, *, store=None):
        import torch.distributed as dist

        host, port = parse_address(address)
        self.id = int(worker_id)
        self.store = store or dist.TCPStore(
            host, port, is_master=False, timeout=datetime.timedelta(seconds=60), wait_for_workers=False
        )
        self.generation = -1
        self.leaving = False
        self.marked = False  # it said ``trained``

    def ready(self) -> Membership:
        """Tell the agent this worker can join (it has started)."""
        self.store.set(f"ready/{self.id}", "1")
        return self

    def ask_to_leave(self) -> None:
        """SIGTERM: leave at the next update boundary (the agent publishes a generation without it)."""
        self.leaving = True
        self.store.set(f"leave/{self.id}", "1")

    def trained(self) -> None:
        """Rank 0, after a committed update: the job has a training state (``trained``), once."""
        if not self.marked:
            self.store.set("trained", "1")
            self.marked = True

    def fresh_start(self) -> None:
        """A generation none of whose members holds the training state: the first (returns), or one
        after every worker that held it is gone (:class:`TrainingError`: starting over would repeat
        the samples the ledger has)."""
        if self.store.check(["trained"]):
            raise TrainingError(
                "every worker that held the training state is gone, so the job cannot go on: start it again",
                rank=self.id,
            )

    def reform(self, gen: int) -> None:
        """Generation ``gen`` did not form here: ask the agent for it again (a newer number)."""
        self.store.set(f"reform/{gen}", "1")

    def finish(self) -> None:
        """Rank 0, after the last update: workers still waiting for a generation end (:class:`JobDone`)."""
        self.store.set("done", "1")

    def _done(self) -> None:
        if self.store.check(["done"]):
            raise JobDone()

    def latest(self) -> int:
        return int(self.store.get("gen")) if self.store.check(["gen"]) else -1

    def members(self, gen: int) -> list[int]:
        return json.loads(self.store.get(f"gen/{gen}"))

    def wait_newer(self, gen: int, timeout: float) -> tuple[int, list[int]]:
        """The newest generation after ``gen`` and its members, waiting at most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            self._done()
            latest = self.latest()
            if latest > gen:
                return latest, self.members(latest)
            if time.monotonic() > deadline:
                raise TrainingError(
                    f"--elastic: no new membership from the agent within {timeout:g} s after generation {gen}",
                    rank=self.id,  # this worker's own view: it says so itself
                )
            time.sleep(0.01)

    def gather(self, gen: int, ids: list[int], timeout: float) -> bool:
        """Wait until every member of ``gen`` has arrived: True (form it), or False (a newer
        generation was published first: skip this one). One decision for all members: the first
        to see every arrival writes ``go``, the first to see a newer generation ``skip`` (an atomic
        compare-and-set), so a member never forms a generation that another member skipped."""
        store = self.store
        store.set(f"form{gen}/here/{self.id}", "1")
        keys = [f"form{gen}/here/{w}" for w in ids]
        deadline = time.monotonic() + timeout
        while True:
            self._done()
            if store.check([f"form{gen}/fate"]):
                return store.get(f"form{gen}/fate") == b"go"
            if store.check(keys):
                return store.compare_set(f"form{gen}/fate", "", "go") == b"go"
            if self.latest() > gen or time.monotonic() > deadline:
                return store.compare_set(f"form{gen}/fate", "", "skip") == b"go"
            time.sleep(0.005)

    def world(self, gen: int, ids: list[int], *, timeout: float, backend: str = "gloo"):
        """Collective over generation ``gen``'s workers: its torch.distributed world, this worker
        at rank ``ids.index(self.id)``; the control plane on a Gloo group of its own. None when a
        newer generation came before every member arrived (a member died meanwhile: no group waits
        for it)."""
        import torch.distributed as dist

        from bno_hvd.processes.torchcomm import TorchComm, connect_fast, connect_timeout, keep_timeout
        from bno_hvd.processes.torchenv import finish_at_exit
        from bno_hvd.processes.torchworld import TorchCollectives
        from bno_hvd.processes.world import World

        # arriving waits longer than a collective: a member may still be timing out of the last generation
        if not self.gather(gen, ids, FORMING_FACTOR * timeout):
            return None
        rank, size = ids.index(self.id), len(ids)
        store = dist.PrefixStore(f"gen{gen}", self.store)
        limit = datetime.timedelta(seconds=timeout)
        _forget_failed_groups()
        connect_fast()  # a peer that dies in the handshake fails each group's forming within ``timeout``
        connect = connect_timeout(limit)
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=connect)
        keep_timeout(connect, limit)
        finish_at_exit()  # a worker that exits with its groups (bad input) destroys them, not the finalization
        self.generation = gen
        control = TorchComm()  # its collectives wait ``timeout`` too, as every group's of this world
        note = f"--elastic: generation {gen}, workers {ids}; gradients summed by torch.distributed over {backend}"
        # no sit-out sets: a rank never sits out, the split changes instead
        return World(
            TorchCollectives(control), rank, size, 0, control, None, [note], backend, engine="torch", members=ids
        )


def _forget_failed_groups() -> None:
    """Name this generation's default group as its peers do. torch names a group by a count of the
    groups made since the last ``destroy_process_group()``, and an ``init_process_group`` whose
    rendezvous timed out still counted one: the next default group was named "1" here and "0" on a
    peer whose last group had formed and been destroyed, the two waited on different store keys, and
    every formation after timed out (CI of 80d6803: "generation 10 did not form 4 times in a row")."""
    from torch.distributed import distributed_c10d

    if not distributed_c10d.is_initialized() and hasattr(distributed_c10d, "_world"):
        distributed_c10d._world.group_count = 0  # what destroy_process_group() sets


def leave_world() -> None:
    """Drop this generation's groups (after a failure or before the next generation)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
