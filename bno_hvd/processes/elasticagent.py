"""The elastic agent (``bno-hvd elastic``): starts the workers of an elastic job, watches them, and
publishes each new membership (:mod:`bno_hvd.processes.membership`).

It plays the part torchrun's agent plays for a torchrun job, the store and the workers' parent,
but it restarts nobody: a worker that ends (SIGKILL, a crash) is dropped from the next
generation and the survivors re-form in their own processes; a worker asked to leave (SIGTERM)
is dropped at an update boundary; ``SIGUSR1`` to the agent starts one more worker, which joins at
the next update boundary once it has started. The agent sees a worker end at once (it is its
child: no heartbeat to time out). It exits 0 when the workers of the last generation have all
ended with 0 (the training finished), and 1, with one line, when fewer than ``min_ranks`` remain
or ``timeout`` seconds pass. A worker that exits 2 found bad input (a :class:`UsageError`, which
every worker finds alike and worker 0 alone prints): no death, the end of the job, with exit 2.

Usage::

    code = ElasticAgent([sys.executable, "-m", "bno_hvd", "train", "--engine", "torch", "--elastic", ...],
                        nproc=4, max_ranks=4).run()
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from bno_hvd.common.errors import UsageError
from bno_hvd.processes.membership import ID_ENV, STORE_ENV

POLL_S = 0.01  # how often the agent looks at its workers
SETTLE_S = 0.05  # deaths this close together go into one generation (two ranks killed at once)


class ElasticAgent:
    """Args:
    command: a worker's command line (``bno-hvd train --engine torch --elastic ...``).
    nproc: workers at the start. min_ranks / max_ranks: the fewest the job goes on with, the most it takes.
    timeout: seconds the whole job may take. env: the workers' environment (default: this one).
    """

    def __init__(self, command, nproc, *, min_ranks=1, max_ranks=None, timeout=3600.0, env=None, out=sys.stderr):
        self.command, self.nproc, self.min_ranks = list(command), int(nproc), int(min_ranks)
        self.max_ranks = int(max_ranks or nproc)
        self.timeout, self.out = float(timeout), out
        self.env = dict(os.environ if env is None else env)
        self.workers: dict[int, subprocess.Popen] = {}
        self.members: list[int] = []
        self.generation = -1
        self.joining: list[int] = []  # started, not yet members
        self.wanted = 0  # joins asked for by SIGUSR1 and not yet started
        self.store = None

    def say(self, line: str) -> None:
        self.out.write(f"bno-hvd elastic: {line}\n")
        self.out.flush()

    def spawn(self) -> int:
        wid = len(self.workers)
        env = {**self.env, STORE_ENV: f"127.0.0.1:{self.store.port}", ID_ENV: str(wid)}
        env.setdefault("OMP_NUM_THREADS", "1")
        self.workers[wid] = subprocess.Popen(self.command, env=env)
        return wid

    def publish(self, members: list[int], why: str) -> None:
        self.members, self.generation = sorted(members), self.generation + 1
        self.store.set(f"gen/{self.generation}", json.dumps(self.members))
        self.store.set("gen", str(self.generation))
        self.say(f"generation {self.generation}: workers {self.members} ({why})")

    def run(self) -> int:
        import torch.distributed as dist

        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        previous = signal.signal(signal.SIGUSR1, self._join_asked)
        deadline = time.monotonic() + self.timeout
        try:
            self.joining = [self.spawn() for _ in range(self.nproc)]
            return self._watch(deadline)
        finally:
            signal.signal(signal.SIGUSR1, previous)
            for proc in self.workers.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def _join_asked(self, signum, frame) -> None:
        self.wanted += 1

    def _watch(self, deadline: float) -> int:
        while time.monotonic() < deadline:
            code = self._tick(deadline)
            if code is not None:
                return code
            time.sleep(POLL_S)
        self.say(f"error: the job did not end within --timeout {self.timeout:g} s")
        return 1

    def _tick(self, deadline: float) -> int | None:
        """One look at the workers; an exit code once the job is over."""
        refused = [w for w, proc in self.workers.items() if proc.poll() == UsageError.exit_code]
        if refused:
            return self._refused(refused[0], deadline)
        while self.wanted and len(self.members) + len(self.joining) < self.max_ranks:
            self.wanted -= 1
            self.joining.append(self.spawn())
        failed = [w for w in self.joining if self.workers[w].poll() is not None]
        self.joining = [w for w in self.joining if w not in failed]
        ready = [w for w in self.joining if self.store.check([f"ready/{w}"])]
        ended = self._ended()
        if ended:
            time.sleep(SETTLE_S)
            ended = self._ended()
        finished = [w for w in self.members if self.workers[w].poll() == 0]
        if finished:
            return self._finish()
        leaving = [w for w in self.members if w not in ended and self.store.check([f"leave/{w}"])]
        if self.generation < 0:
            if failed:
                self.say(f"error: worker(s) {failed} ended before the job started")
                return 1
            if len(ready) < self.nproc:
                return None
        gone = set(ended) | set(leaving)
        if not gone and not ready:
            return None
        members = [w for w in self.members if w not in gone] + ready
        self.joining = [w for w in self.joining if w not in ready]
        if len(members) < self.min_ranks:
            self.say(f"error: {len(members)} worker(s) left, fewer than --min-ranks {self.min_ranks}")
            return 1
        why = [f"{w} ended ({self._status(w)})" for w in ended] + [f"{w} leaves" for w in leaving]
        joins = [f"{w} joins" for w in ready] if self.generation >= 0 else ["start"]
        self.publish(members, ", ".join(why + joins))
        return None

    def _ended(self) -> list[int]:
        return [w for w in self.members if self.workers[w].poll() not in (None, 0)]

    def _status(self, wid: int) -> str:
        code = self.workers[wid].poll()
        return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"

    def _wait(self, wid: int, seconds: float = 120.0) -> int:
        """A worker's exit code, once it has ended (killed after ``seconds``: it hung at its exit)."""
        try:
            return self.workers[wid].wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.workers[wid].kill()
            return self.workers[wid].wait()

    def _refused(self, wid: int, deadline: float) -> int:
        """Worker ``wid`` refused its input: the others (who find the same, or time out of a
        collective with it) end too, then the job; by ``deadline`` at the latest."""
        while time.monotonic() < deadline and any(p.poll() is None for p in self.workers.values()):
            time.sleep(POLL_S)
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self.workers[0].returncode != UsageError.exit_code:  # worker 0 did not say it: say which did
            self.say(f"error: worker {wid} refused its input (exit 2); see its output")
        return UsageError.exit_code

    def _finish(self) -> int:
        """A worker finished training: wait for the others of its generation, end any joiner."""
        for w in self.joining:
            self.workers[w].terminate()
        codes = {w: self._wait(w) for w in self.members}
        bad = {w: c for w, c in codes.items() if c != 0}
        if bad:
            self.say(f"error: worker(s) {sorted(bad)} ended with {sorted(set(bad.values()))} after others finished")
            return 1
        self.say(f"done: generation {self.generation}, workers {self.members} finished")
        return 0
