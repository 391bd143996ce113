"""Who is in an elastic job (``--elastic``), and the torch.distributed world of each generation.

The elastic agent (:mod:`bno_hvd.processes.elasticagent`) hosts a ``TCPStore`` and is the one
authority on membership: it starts the workers, sees at once when one ends (its child), and
publishes *generations*: ``gen`` holds the newest number, ``gen/<n>`` the sorted worker ids of
generation ``n``. A worker's rank in a generation is its id's place in that list (the oldest
surviving worker is rank 0). Workers write ``ready/<id>`` once started and ``leave/<id>`` when
asked to leave (SIGTERM); the agent answers both with a new generation.

Each generation is a torch.distributed job of its own: a Gloo default group whose store keys are
prefixed by the generation, so a worker that dies during a re-formation leaves the others a
bounded wait (the group's timeout) and then the next generation. Survivors are never restarted:
the group is destroyed and made again in the same process.

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

FORMING_FACTOR = 3  # a generation forms within 3 x --elastic-timeout (its members leave the last one by 1 x)
STORE_ENV, ID_ENV = "BNO_ELASTIC_STORE", "BNO_ELASTIC_ID"  # set by the agent for its workers


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


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

    def ready(self) -> Membership:
        """Tell the agent this worker can join (it has started)."""
        self.store.set(f"ready/{self.id}", "1")
        return self

    def ask_to_leave(self) -> None:
        """SIGTERM: leave at the next update boundary (the agent publishes a generation without it)."""
        self.leaving = True
        self.store.set(f"leave/{self.id}", "1")

    def latest(self) -> int:
        return int(self.store.get("gen")) if self.store.check(["gen"]) else -1

    def members(self, gen: int) -> list[int]:
        return json.loads(self.store.get(f"gen/{gen}"))

    def wait_newer(self, gen: int, timeout: float) -> tuple[int, list[int]]:
        """The newest generation after ``gen`` and its members, waiting at most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            latest = self.latest()
            if latest > gen:
                return latest, self.members(latest)
            if time.monotonic() > deadline:
                raise TrainingError(
                    f"--elastic: no new membership from the agent within {timeout:g} s after generation {gen}"
                )
            time.sleep(0.01)

    def world(self, gen: int, ids: list[int], *, timeout: float, backend: str = "gloo"):
        """Collective over generation ``gen``'s workers: its torch.distributed world, this worker
        at rank ``ids.index(self.id)``; the control plane on a Gloo group of its own."""
        import torch.distributed as dist

        from bno_hvd.processes.torchcomm import TorchComm
        from bno_hvd.processes.torchworld import TorchCollectives
        from bno_hvd.processes.world import World

        rank, size = ids.index(self.id), len(ids)
        store = dist.PrefixStore(f"gen{gen}", self.store)
        # forming waits longer than a collective: a member may still be timing out of the last generation
        forming = datetime.timedelta(seconds=FORMING_FACTOR * timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=forming)
        self.generation = gen
        control = TorchComm()
        for group in (dist.group.WORLD, control.group):
            group.set_timeout(datetime.timedelta(seconds=timeout))
        note = f"--elastic: generation {gen}, workers {ids}; gradients summed by torch.distributed over {backend}"
        # no sit-out sets: a rank never sits out, the split changes instead
        return World(
            TorchCollectives(control), rank, size, 0, control, None, [note], backend, engine="torch", members=ids
        )


def leave_world() -> None:
    """Drop this generation's groups (after a failure or before the next generation)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
