"""The elastic agent (``bno-hvd elastic``): starts the workers of an elastic job, watches them, and
publishes each new membership (:mod:`bno_hvd.processes.membership`).

It plays the part torchrun's agent plays for a torchrun job, the store and the workers' parent,
but it restarts nobody: a worker that ends (SIGKILL, a crash) is dropped from the next
generation and the survivors re-form in their own processes; a worker asked to leave (SIGTERM)
is dropped at an update boundary; ``SIGUSR1`` to the agent starts one more worker, which joins at
the next update boundary once it has started. A generation its members could not form (``reform/<n>``:
a timeout under load, a member late or paused) is published again with the members that arrived;
one that did not joins again once it says it is ready. The agent sees a worker end at once (it is its
child: no heartbeat to time out). It exits 0 when the workers of the last generation have all
ended with 0 (the training finished), and 1, with one line, when fewer than ``min_ranks`` remain
or ``timeout`` seconds pass. A worker that exits 2 found bad input (a :class:`UsageError`, which
every worker finds alike and worker 0 alone prints): no death, the end of the job, with exit 2.

Several machines: one agent per machine (``--nnodes``, ``--node-rank``, ``--store HOST:PORT``).
The agent of node 0 is this one and hosts the store; the others run
:func:`bno_hvd.processes.elasticnode.serve`, which reports their workers' ends through the store
and beats; a node that stops beating is lost with all its workers (a machine that died).

Usage::

    code = ElasticAgent([sys.executable, "-m", "bno_hvd", "train", "--engine", "torch", "--elastic", ...],
                        nproc=4, max_ranks=4).run()
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from bno_hvd.common.errors import UsageError
from bno_hvd.processes.elasticnode import LOST_S, POLL_S, Node

SETTLE_S = 0.05  # deaths this close together go into one generation (two ranks killed at once)
BYE_S = 5.0  # how long node 0 waits for the other nodes to see the job's end
MAX_REFORMS = 3  # the same workers' generation asked again this often in a row, then the job ends


class ElasticAgent:
    """Args:
    command: a worker's command line (``bno-hvd train --engine torch --elastic ...``).
    nproc: workers at the start on each node. min_ranks / max_ranks: the fewest the job goes on
    with, the most it takes (default: ``nproc * nnodes``). timeout: seconds the whole job may take.
    env: the workers' environment (default: this one). address: the store's ``host:port`` as
    every worker reaches it (default: 127.0.0.1 on a free port, one machine). nnodes: the agents at
    the start, this one included (each with ``nproc`` workers).
    """

    def __init__(
        self, command, nproc, *, min_ranks=1, max_ranks=None, timeout=3600.0, env=None, out=sys.stderr,
        address=None, nnodes=1,
    ):  # fmt: skip
        self.command, self.env, self.out, self.address = list(command), env, out, address
        self.nproc, self.min_ranks, self.nnodes = int(nproc), int(min_ranks), int(nnodes)
        self.max_ranks = int(max_ranks or nproc * nnodes)
        self.timeout = float(timeout)
        self.node: Node | None = None  # this machine's workers
        self.nodes: dict[int, int] = {}  # worker id -> its node, every worker of the job
        self.seen = 0  # worker ids below this are in self.nodes
        self.beats: dict[int, tuple[int, float]] = {}  # node -> (its last beat, when it changed)
        self.members: list[int] = []
        self.generation = -1
        self.joining: list[int] = []  # started, not yet members
        self.reforms = 0  # generations in a row re-published because the last did not form
        self.store = None

    def say(self, line: str) -> None:
        self.out.write(f"bno-hvd elastic: {line}\n")
        self.out.flush()

    def publish(self, members: list[int], why: str) -> None:
        self.members, self.generation = sorted(members), self.generation + 1
        self.store.set(f"gen/{self.generation}", json.dumps(self.members))
        self.store.set("gen", str(self.generation))
        self.say(f"generation {self.generation}: workers {self.members} ({why})")

    def run(self) -> int:
        import torch.distributed as dist

        host, port = (self.address or "127.0.0.1:0").rsplit(":", 1)
        self.store = dist.TCPStore(host, int(port), is_master=True, wait_for_workers=False)
        address = self.address or f"127.0.0.1:{self.store.port}"
        self.node = Node(self.command, self.store, address, 0, self.env, self.out)
        previous = signal.signal(signal.SIGUSR1, self.node.join_asked)
        deadline = time.monotonic() + self.timeout
        code = 1
        try:
            self.joining = [self.node.spawn() for _ in range(self.nproc)]
            code = self._watch(deadline)
            return code
        finally:
            signal.signal(signal.SIGUSR1, previous)
            self.node.kill_all()
            self._end(code)

    def _end(self, code: int) -> None:
        """Tell the other nodes the job's exit code and give them a moment to see it (the store ends with us)."""
        self.store.set("end", str(code))
        others = {n for n in self.nodes.values() if n and not self._lost(n)}
        until = time.monotonic() + BYE_S
        while others and time.monotonic() < until and not self.store.check([f"bye/{n}" for n in others]):
            time.sleep(POLL_S)

    def _watch(self, deadline: float) -> int:
        while time.monotonic() < deadline:
            code = self._tick(deadline)
            if code is not None:
                return code
            time.sleep(POLL_S)
        self.say(f"error: the job did not end within --timeout {self.timeout:g} s")
        return 1

    def _look(self) -> None:
        """Learn of the workers other nodes started, and of their beats."""
        self.node.report()
        for wid in range(self.seen, self.store.add("workers", 0)):
            if wid in self.node.procs:
                self.nodes[wid] = 0
            elif self.store.check([f"node/{wid}"]):
                self.nodes[wid] = int(self.store.get(f"node/{wid}"))
                self.joining.append(wid)
            else:
                break  # its node has not said where it runs yet: next time
            self.seen = wid + 1
        now = time.monotonic()
        for n in set(self.nodes.values()) - {0}:
            beat = self.store.add(f"beat/{n}", 0)
            if self.beats.get(n, (None,))[0] != beat:
                self.beats[n] = (beat, now)

    def _lost(self, node: int) -> bool:
        return node != 0 and time.monotonic() - self.beats.get(node, (0, time.monotonic()))[1] > LOST_S

    def poll(self, wid: int) -> int | None:
        """A worker's exit code (negative: a signal; -9 for a lost node's), None while it runs."""
        proc = self.node.procs.get(wid)
        if proc is not None:
            return proc.poll()
        if self.store.check([f"exit/{wid}"]):
            return int(self.store.get(f"exit/{wid}"))
        return -signal.SIGKILL if self._lost(self.nodes[wid]) else None

    def _tick(self, deadline: float) -> int | None:
        """One look at the workers; an exit code once the job is over."""
        self._look()
        refused = [w for w in self.nodes if self.poll(w) == UsageError.exit_code]
        if refused:
            return self._refused(refused[0], deadline)
        while self.node.wanted and len(self.members) + len(self.joining) < self.max_ranks:
            self.node.wanted -= 1
            self.joining.append(self.node.spawn())
        failed = [w for w in self.joining if self.poll(w) is not None]
        self.joining = [w for w in self.joining if w not in failed]
        ready = [w for w in self.joining if self.store.check([f"ready/{w}"])]
        ended = self._ended()
        if ended:
            time.sleep(SETTLE_S)
            ended = self._ended()
        finished = [w for w in self.members if self.poll(w) == 0]
        if finished:
            return self._finish()
        leaving = [w for w in self.members if w not in ended and self.store.check([f"leave/{w}"])]
        if self.generation < 0:
            if failed:
                self.say(f"error: worker(s) {failed} ended before the job started")
                return 1
            if len(ready) < self.nproc * self.nnodes:
                return None
        reform = self.generation >= 0 and self.store.check([f"reform/{self.generation}"])
        absent = (
            [w for w in self.members if not self.store.check([f"form{self.generation}/here/{w}"])] if reform else []
        )
        gone = set(ended) | set(leaving) | set(absent)
        kept = [w for w in self.members if w not in gone]
        ready = ready[: max(0, self.max_ranks - len(kept))]
        if not gone and not ready and not reform:
            return None
        self.joining = [w for w in self.joining if w not in ready]
        if len(kept) + len(ready) < self.min_ranks:
            self.say(f"error: {len(kept) + len(ready)} worker(s) left, fewer than --min-ranks {self.min_ranks}")
            return 1
        why = [f"{w} ended ({self._status(w)})" for w in ended] + [f"{w} leaves" for w in leaving]
        late = [w for w in absent if w not in ended and w not in leaving]  # alive: a failed formation, paused
        why += [f"{w} did not arrive" for w in late]
        self.reforms = self.reforms + 1 if reform and not gone and not ready else 0  # the same workers again
        if self.reforms > MAX_REFORMS:
            self.say(
                f"error: generation {self.generation} did not form {MAX_REFORMS + 1} times in a row (its members' "
                "rendezvous timed out); a longer --elastic-timeout gives a loaded machine more time"
            )
            return 1
        why += [f"generation {self.generation} did not form"] if reform else []
        joins = [f"{w} joins" for w in ready] if self.generation >= 0 else ["start"]
        for w in late:  # it joins again once it says it is ready
            self.store.delete_key(f"ready/{w}")
            self.joining.append(w)
        self.publish(kept + ready, ", ".join(why + joins))
        return None

    def _ended(self) -> list[int]:
        return [w for w in self.members if self.poll(w) not in (None, 0)]

    def _status(self, wid: int) -> str:
        code = self.poll(wid)
        if wid not in self.node.procs and not self.store.check([f"exit/{wid}"]):
            return f"node {self.nodes[wid]} lost"
        return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"

    def _wait(self, wid: int, seconds: float = 120.0) -> int:
        """A worker's exit code, once it has ended (killed after ``seconds``: it hung at its exit)."""
        if wid in self.node.procs:
            try:
                return self.node.procs[wid].wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                self.node.procs[wid].kill()
                return self.node.procs[wid].wait()
        until = time.monotonic() + seconds
        while (code := self.poll(wid)) is None and time.monotonic() < until:
            self._look()
            time.sleep(POLL_S)
        return -signal.SIGKILL if code is None else code

    def _refused(self, wid: int, deadline: float) -> int:
        """Worker ``wid`` refused its input: the others (who find the same, or time out of a
        collective with it) end too, then the job; by ``deadline`` at the latest."""
        while time.monotonic() < deadline and any(self.poll(w) is None for w in self.nodes):
            self._look()
            time.sleep(POLL_S)
        self.node.kill_all()
        if self.poll(0) != UsageError.exit_code:  # worker 0 did not say it: say which did
            self.say(f"error: worker {wid} refused its input (exit 2); see its output")
        return UsageError.exit_code

    def _finish(self) -> int:
        """A worker finished training: wait for the others of its generation, end any joiner."""
        for w in self.joining:
            if w in self.node.procs:
                self.node.procs[w].terminate()
        codes = {w: self._wait(w) for w in self.members}
        bad = {w: c for w, c in codes.items() if c != 0}
        if bad:
            self.say(f"error: worker(s) {sorted(bad)} ended with {sorted(set(bad.values()))} after others finished")
            return 1
        self.say(f"done: generation {self.generation}, workers {self.members} finished")
        return 0
