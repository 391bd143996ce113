"""A Slurm cluster on this machine, from Debian's packages, for tests of the batch scripts.

One ``munged`` and one ``slurmctld`` and a ``slurmd`` per node, all with their configuration,
keys, sockets, spool and state directories, logs and pid files inside one work directory, on
free ports, run in the foreground as children of this process (their pids are the ones we
hold). Several ``slurmd`` "nodes" share this machine (``NodeHostname=localhost``, one port
each). :meth:`SlurmCluster.stop` cancels the jobs, stops the daemons, kills every process that
still carries this cluster's ``SLURM_CONF`` (only processes of this cluster can: the path is
unique to it) and removes the work directory; it is safe to call at any point, also after a
half-finished :meth:`start`.

Usage::

    cluster = SlurmCluster(workdir, nodes={"node0": 4})
    try:
        cluster.start()
        job = cluster.sbatch(["launch/slurm.sbatch", "--updates", "20"], cwd=ROOT)
        job.exit_code, job.output
    finally:
        cluster.stop()
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

SLURM_BINARIES = {  # program -> Debian package
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "sinfo": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
    "scontrol": "slurm-client",
}
APT = "--no-install-recommends slurmctld slurmd slurm-client munge"


class SlurmError(RuntimeError):
    """A daemon that did not start or a command that failed (the message says which, with its log)."""


def program(name: str) -> str | None:
    """Full path of a Slurm or munge program (the daemons live in /usr/sbin, often not on PATH)."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"]))


def unavailable_reason() -> str | None:
    """Why this machine cannot run a Slurm cluster, or None when it can."""
    if os.geteuid() != 0:
        return f"a private Slurm cluster needs root (slurmd runs jobs as their users); running as uid {os.geteuid()}"
    missing = [prog for prog in SLURM_BINARIES if program(prog) is None]
    if missing:
        packages = sorted({SLURM_BINARIES[prog] for prog in missing})
        return (
            f"{', '.join(missing)} not found: Debian packages {' '.join(packages)} missing "
            f"(launch/setup installs them; by hand: apt-get install {APT})"
        )
    return None


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (other test runs pick their own)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(fh.readlines()[-lines:]).strip()
    except OSError:
        return f"({path} not written)"


@dataclass
class Job:
    job_id: int
    exit_code: int  # of `sbatch --wait`: the job's exit code
    output: str  # the job's output file (stdout and stderr)
    sbatch_stderr: str


class SlurmCluster:
    """``nodes`` maps node names to their CPUs (declared, not real: ``config_overrides``);
    ``partitions`` maps partition names to node lists (default: one partition ``debug`` with all)."""

    def __init__(self, workdir: str, nodes: dict[str, int] | None = None, partitions: dict | None = None):
        self.workdir = os.path.abspath(workdir)
        self.nodes = dict(nodes or {"node0": 4})
        self.partitions = dict(partitions or {"debug": list(self.nodes)})
        self.conf = os.path.join(self.workdir, "slurm.conf")
        self.munge_socket = os.path.join(self.workdir, "munge", "munge.socket")
        self.name = f"bno{os.getpid() % 100000}"
        self.procs: dict[str, subprocess.Popen] = {}  # daemon name -> its process
        self.job_seconds: list[float] = []  # wall seconds of every job that ended with exit 0

    # --- environment and commands ----------------------------------------------------
    def env(self, extra: dict | None = None) -> dict:
        """This environment pointed at this cluster (no SLURM_* of an outer allocation)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = self.conf
        env.update(extra or {})
        return env

    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=self.env())
        if check and proc.returncode != 0:
            raise SlurmError(f"`{' '.join(cmd)}` failed: {(proc.stderr or proc.stdout).strip()}")
        return proc

    # --- start ---------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> SlurmCluster:
        for sub in ("munge", "state", "log", "run", "out"):
            os.makedirs(os.path.join(self.workdir, sub), mode=0o700, exist_ok=True)
        os.chmod(self.workdir, 0o700)  # munged refuses a key or socket in a directory others can write
        self._start_munge(timeout)
        ctld_port, *node_ports = free_ports(1 + len(self.nodes))
        self._write_conf(ctld_port, node_ports)
        self._spawn("slurmctld", [program("slurmctld"), "-D", "-f", self.conf])
        self._wait(lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") > 0, timeout, "slurmctld")
        for node in self.nodes:
            for sub in ("spool", "tmp"):
                os.makedirs(os.path.join(self.workdir, sub, node), mode=0o700, exist_ok=True)
            self._spawn(f"slurmd-{node}", [program("slurmd"), "-D", "-N", node, "-f", self.conf])
        self._wait(self._all_idle, timeout, "every node idle in sinfo")
        return self

    def _start_munge(self, timeout: float) -> None:
        key = os.path.join(self.workdir, "munge", "munge.key")
        with open(key, "wb") as fh:
            fh.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self._spawn(
            "munged",
            [
                program("munged"),
                "--foreground",
                "--force",  # /tmp above the work directory is world-writable: a warning, not a refusal
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={os.path.join(self.workdir, 'run', 'munged.pid')}",
                f"--log-file={os.path.join(self.workdir, 'log', 'munged.log')}",
                f"--seed-file={os.path.join(self.workdir, 'munge', 'munged.seed')}",
            ],
        )

        def credential_roundtrip() -> bool:
            if not os.path.exists(self.munge_socket):
                return False
            proc = subprocess.run(
                f"munge -n -S {self.munge_socket} | unmunge -S {self.munge_socket}",
                shell=True,
                capture_output=True,
                timeout=10,
            )
            return proc.returncode == 0

        self._wait(credential_roundtrip, timeout, "munged (a credential round trip)")

    def _write_conf(self, ctld_port: int, node_ports: list[int]) -> None:
        w = self.workdir
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={w}/state",
            f"SlurmdSpoolDir={w}/spool/%n",
            # per node: Slurm's PMIx plugin puts each step's client directory under TmpFS, named
            # by job and step only, so two "nodes" on one machine would collide in one /tmp
            f"TmpFS={w}/tmp/%n",
            f"SlurmctldPidFile={w}/run/slurmctld.pid",
            f"SlurmdPidFile={w}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={w}/log/slurmctld.log",
            f"SlurmdLogFile={w}/log/slurmd-%n.log",
            # no cgroups: linuxproc tracks a job's processes by parentage, task/none binds nothing
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            # trust the declared CPUs, not the 2 cores slurmd finds
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            # heterogeneous jobs are started by the backfill pass: every second, not every 30 s
            "SchedulerParameters=bf_interval=1",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            # `sbatch --wait` sleeps 2 s, then 4x longer while that is under MinJobAge/2 (2, 8, 32 s:
            # a 10 s job took 42 s with MinJobAge=60); at 4 it polls every 2 s
            "MinJobAge=4",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        for (node, cpus), port in zip(self.nodes.items(), node_ports):
            lines.append(
                f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={cpus} State=UNKNOWN"
            )
        for i, (part, members) in enumerate(self.partitions.items()):
            default = "YES" if i == 0 else "NO"
            lines.append(f"PartitionName={part} Nodes={','.join(members)} Default={default} MaxTime=INFINITE State=UP")
        with open(self.conf, "w") as fh:
            fh.write("\n".join(lines) + "\n")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(os.path.join(self.workdir, "log", f"{name}.stderr"), "w")
        # own session: a Ctrl-C of pytest reaches the fixture's cleanup, not the daemons first
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=self.workdir, start_new_session=True
        )
        log.close()

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SlurmError(
                        f"{name} exited with code {proc.returncode} while waiting for {what}:\n{self._logs(name)}"
                    )
            if ready():
                return
            time.sleep(0.2)
        raise SlurmError(f"timed out after {timeout:.0f} s waiting for {what}:\n{self._logs()}")

    def _all_idle(self) -> bool:
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N %t", check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        return all(states.get(node) == "idle" for node in self.nodes)

    def _logs(self, first: str = "") -> str:
        """The end of every log, those of daemon ``first`` before the others."""
        logs = sorted(
            os.listdir(os.path.join(self.workdir, "log")), key=lambda name: (not name.startswith(first), name)
        )
        return "\n".join(f"--- {name}\n{tail(os.path.join(self.workdir, 'log', name))}" for name in logs)

    # --- jobs ----------------------------------------------------------------------------
    def sbatch(self, args: list[str], *, cwd: str, env: dict | None = None, timeout: float = 180) -> Job:
        """``sbatch --wait ARGS`` (the script and its arguments, after any sbatch options); the output
        file is ``<workdir>/out/job-<id>.out``."""
        out = os.path.join(self.workdir, "out", "job-%j.out")
        cmd = ["sbatch", "--wait", "--parsable", f"--output={out}", *args]
        started = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env(env), cwd=cwd)
        except subprocess.TimeoutExpired as err:
            queue = self.run("squeue", "--format=%i %T %r %j", check=False).stdout.strip()
            raise SlurmError(
                f"`{' '.join(cmd)}` still waiting after {timeout:.0f} s; squeue:\n{queue}\n{self._logs()}"
            ) from err
        match = re.match(r"(\d+)", proc.stdout.strip())
        if not match:
            raise SlurmError(f"`{' '.join(cmd)}` submitted no job (exit {proc.returncode}): {proc.stderr.strip()}")
        job_id = int(match.group(1))
        if proc.returncode == 0:
            self.job_seconds.append(time.monotonic() - started)
        with open(out.replace("%j", str(job_id)), errors="replace") as fh:
            output = fh.read()
        return Job(job_id, proc.returncode, output, proc.stderr)

    # --- stop ----------------------------------------------------------------------------
    def cancel_all(self, timeout: float = 30) -> None:
        """Cancel every job and wait until the queue is empty."""
        self.run("scancel", "--full", "--user=root", check=False, timeout=10)
        self._wait(lambda: not self.run("squeue", "--noheader", check=False).stdout.strip(), timeout, "an empty queue")

    def stop(self, remove: bool = True) -> list[str]:
        """Cancel jobs, stop the daemons, kill what still carries this cluster's SLURM_CONF, remove
        the work directory. Never raises; returns what could not be stopped or removed."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", "--full", "--user=root", check=False, timeout=10)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and self.run("squeue", "--noheader", check=False).stdout.strip():
                    time.sleep(0.3)
            except (subprocess.TimeoutExpired, OSError):
                pass
        for name in reversed(list(self.procs)):  # slurmd first, munged last
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        for pid in self.stray_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        left = [f"pid {pid}" for pid in self.stray_pids(wait=5)]
        if remove and not left:
            shutil.rmtree(self.workdir, ignore_errors=True)
            if os.path.exists(self.workdir):
                left.append(self.workdir)
        return left

    def stray_pids(self, wait: float = 0) -> list[int]:
        """Processes whose environment holds this cluster's SLURM_CONF: its daemons, slurmstepd and
        the job steps (they inherit it), and nothing else."""
        marker = f"SLURM_CONF={self.conf}".encode()
        deadline = time.monotonic() + wait
        while True:
            found = []
            for entry in os.listdir("/proc"):
                if not entry.isdigit() or int(entry) == os.getpid():
                    continue
                try:
                    with open(f"/proc/{entry}/environ", "rb") as fh:
                        if marker in fh.read().split(b"\0"):
                            found.append(int(entry))
                except OSError:
                    continue
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.2)
