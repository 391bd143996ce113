"""Start real mpirun/horovodrun jobs and CLI runs as subprocesses, with the project's MPI settings."""

import os
import subprocess
import sys
import time

import pytest

from bno_hvd.cli import launching

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.dirname(sys.executable)
FASHION_DIR = "/usr/share/datasets/fashion-mnist"
CLI_TIMEOUT = 120  # s a plain bno-hvd subprocess may take before it counts as a hang (it imports torch first)


# A rank of a torchrun job on Gloo can hang in its exit after its work is done: torch frees a Gloo
# group from a DDP model's Reducer with the GIL held while the group's worker thread waits for the
# GIL (pytorch/pytorch#56297; docs/ddp.md). tests/support/run_port.py avoids that path; should it
# happen anyway, a job whose every rank wrote its done marker and which then does not exit is
# killed after a short grace and ends as this expected failure. A wrong result, an error, or a rank
# that never finished its work (a plain timeout) still fails the test.
class ExitHang(subprocess.TimeoutExpired):
    """Every rank of a torchrun job finished its work (wrote its done marker), but the job did not exit."""


class ExitAbort(ExitHang):
    """Every rank finished its work, but one then aborted in the interpreter's end: a Gloo worker
    thread freed a tensor there ("terminate called without an active exception", pytorch/pytorch#190489;
    bno_hvd.processes.torchenv.finish_process_group removes the causes known)."""


TORCHRUN_EXIT_HANG = pytest.mark.xfail(
    raises=ExitHang, strict=False, reason="a torchrun rank hung or aborted at exit after its work (Gloo teardown)"
)
ABORTED = "terminate called without an active exception"


def mpi_env(extra=None):
    """This environment with the project's MPI settings, the venv first on PATH, this checkout first on PYTHONPATH."""
    env = launching.mpi_env()
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def mpirun(np_, args, *, timeout=300, env=None, cwd=None):
    """Run ``args`` (a list) on ``np_`` ranks with plain mpirun; returns CompletedProcess."""
    return launching.mpirun(np_, args, timeout=timeout, env=mpi_env(env), cwd=cwd or ROOT)


def horovodrun(np_, args, *, timeout=300, env=None, hostfile=None):
    cmd = [os.path.join(VENV_BIN, "horovodrun"), "-np", str(np_), "--mpi"]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    else:
        cmd += ["-H", f"localhost:{np_}"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout, env=mpi_env(env), cwd=ROOT)


def torchrun(np_, args, *, timeout=300, env=None, done=(), grace=20, launcher=None):
    """Run the Python script ``args[0]`` with ``args[1:]`` on ``np_`` local ranks under torchrun (a
    rendezvous of its own on a free port: ``--standalone``), or under ``launcher`` (a command that
    takes the script next, e.g. ``accelerate launch ...``); returns CompletedProcess. ``done``: the
    files the ranks write once their work is done (tests/support/run_port.py); when all exist and
    the job has not exited ``grace`` seconds later, it is killed and ExitHang raised (ExitAbort: a
    rank aborted at exit after they all were written). On any
    timeout torchrun and every process under it are killed (a rank hung at exit outlives torchrun)."""
    script = os.path.join(VENV_BIN, "torchrun")  # (a system python's torchrun may live elsewhere: run its module)
    if launcher is None:
        launcher = [script] if os.path.exists(script) else [sys.executable, "-m", "torch.distributed.run"]
        launcher = [*launcher, "--standalone", "--nproc-per-node", str(np_)]
    cmd = list(launcher)
    run_env = mpi_env({"OMP_NUM_THREADS": "1", **(env or {})})
    proc = subprocess.Popen(
        cmd + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env, cwd=ROOT
    )
    start, finished = time.monotonic(), None
    while True:
        try:
            out, err = proc.communicate(timeout=1 if done else timeout)  # retrying loses no output
            if proc.returncode and done and all(os.path.exists(p) for p in done) and ABORTED in err:
                raise ExitAbort(proc.args, 0, out, err)
            return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if finished is None and done and all(os.path.exists(p) for p in done):
                finished = now
            if finished is not None and now - finished > grace:
                raise ExitHang(proc.args, grace, *kill_tree(proc)) from None
            if now - start > timeout:
                raise subprocess.TimeoutExpired(proc.args, timeout, *kill_tree(proc)) from None


def kill_tree(proc):
    """Kill ``proc`` and every process under it; returns what it wrote (stdout, stderr)."""
    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for p in [*tree, proc]:
        try:
            p.kill()
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    return proc.communicate()


def python_cmd(*args):
    return [sys.executable, *args]


def bno_cmd(*args):
    return [sys.executable, "-m", "bno_hvd", *args]


def run_cli(*args, timeout=CLI_TIMEOUT, env=None):
    """``bno-hvd ARGS`` in a plain (non-MPI) subprocess."""
    return subprocess.run(bno_cmd(*args), capture_output=True, text=True, timeout=timeout, env=mpi_env(env), cwd=ROOT)


def assert_ok(proc):
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-4000:]}"
    )
