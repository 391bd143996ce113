"""One machine's part of an elastic job: its workers, started, watched and reported to the job's store.

Every agent of ``bno-hvd elastic`` runs one :class:`Node` for the workers on its machine. The
agent of node 0 also hosts the store and decides the memberships
(:mod:`bno_hvd.processes.elasticagent`); the agent of any other node only runs :func:`serve`.
Through the store, a node gives each worker it starts a job-wide id (``workers``, a counter) and
says where it runs (``node/<id>``), writes each worker's exit code once it ended (``exit/<id>``)
and beats (``beat/<node>``, a counter, every :data:`BEAT_S`): a node whose beat stops for
:data:`LOST_S` is lost, with every worker on it (a machine that died, or was cut off: its own
agent ends its workers once it cannot reach the store). Node 0 writes ``end`` with the job's exit
code; every other node then ends whatever still runs on it, says ``bye/<node>`` and exits with
that code.

Usage (a node other than 0; the CLI builds it from ``--store`` and ``--node-rank``)::

    code = serve(Node(command, store, "10.0.0.1:29400", index=1), nproc=2, timeout=3600)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from bno_hvd.processes.membership import ID_ENV, STORE_ENV

POLL_S = 0.01  # how often an agent looks at its workers
BEAT_S = 0.2  # a node's heartbeat
LOST_S = 5.0  # a node silent this long is lost, with its workers


class Node:
    """The workers an agent starts on its own machine. Args: ``command`` a worker's command line,
    ``store`` the job's TCPStore, ``address`` its ``host:port`` as the workers reach it, ``index``
    this node's rank, ``env`` the workers' environment (default: this one)."""

    def __init__(self, command, store, address: str, index: int = 0, env=None, out=sys.stderr):
        self.command, self.store, self.address, self.index = list(command), store, address, int(index)
        self.env = dict(os.environ if env is None else env)
        self.out = out
        self.procs: dict[int, subprocess.Popen] = {}
        self.reported: set[int] = set()
        self.wanted = 0  # joins asked for by SIGUSR1 and not yet started
        self.next_beat = 0.0

    def say(self, line: str) -> None:
        self.out.write(f"bno-hvd elastic: {line}\n")
        self.out.flush()

    def spawn(self) -> int:
        wid = self.store.add("workers", 1) - 1
        self.store.set(f"node/{wid}", str(self.index))
        env = {**self.env, STORE_ENV: self.address, ID_ENV: str(wid)}
        env.setdefault("OMP_NUM_THREADS", "1")
        self.procs[wid] = subprocess.Popen(self.command, env=env)
        return wid

    def join_asked(self, signum=None, frame=None) -> None:
        self.wanted += 1

    def report(self) -> None:
        """Each worker's exit code into the store once it ended; a beat now and then."""
        for wid, proc in self.procs.items():
            if wid not in self.reported and proc.poll() is not None:
                self.store.set(f"exit/{wid}", str(proc.returncode))
                self.reported.add(wid)
        if self.index and time.monotonic() >= self.next_beat:
            self.store.add(f"beat/{self.index}", 1)
            self.next_beat = time.monotonic() + BEAT_S

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def serve(node: Node, nproc: int, timeout: float) -> int:
    """A node other than 0: start ``nproc`` workers, more on SIGUSR1, report them until node 0
    ends the job (its exit code), or ``timeout`` passes or the store is gone (1)."""
    previous = signal.signal(signal.SIGUSR1, node.join_asked)
    deadline = time.monotonic() + timeout
    try:
        node.store.set(f"start/{node.index}", str(nproc))
        for _ in range(nproc):
            node.spawn()
        while time.monotonic() < deadline:
            while node.wanted:
                node.wanted -= 1
                node.spawn()
            node.report()
            if node.store.check(["end"]):
                code = int(node.store.get("end"))
                node.kill_all()
                node.report()
                node.store.set(f"bye/{node.index}", "1")
                return code
            time.sleep(POLL_S)
        node.say(f"error: node {node.index}: the job did not end within --timeout {timeout:g} s")
        return 1
    except (RuntimeError, OSError) as err:  # the store (node 0's agent) is gone
        node.say(f"error: node {node.index} lost the job's store at {node.address}: {str(err).splitlines()[0]}")
        return 1
    finally:
        signal.signal(signal.SIGUSR1, previous)
        node.kill_all()
