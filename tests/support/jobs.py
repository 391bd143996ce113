"""Start real mpirun/horovodrun jobs and CLI runs as subprocesses, with the project's MPI settings."""

import os
import subprocess
import sys

import pytest

from bno_hvd.cli import launching

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.dirname(sys.executable)
FASHION_DIR = "/usr/share/datasets/fashion-mnist"
# A rank of a torchrun job on Gloo can hang in its exit after its work is done (seen here on the
# 2-core machine, also with the plain DDP twin, which holds no bno-hvd code): tolerated as an
# expected failure, and only as a timeout, until that hang is settled (issue 39). A wrong result,
# an error or a traceback still fails the test.
TORCHRUN_EXIT_HANG = pytest.mark.xfail(
    raises=subprocess.TimeoutExpired, strict=False, reason="a torchrun rank may hang at exit (Gloo teardown)"
)


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


def torchrun(np_, args, *, timeout=300, env=None):
    """Run the Python script ``args[0]`` with ``args[1:]`` on ``np_`` local ranks under torchrun (a
    rendezvous of its own on a free port: ``--standalone``); returns CompletedProcess. On a timeout
    torchrun and every process under it are killed (a rank hung at exit would outlive torchrun)."""
    import psutil

    cmd = [os.path.join(VENV_BIN, "torchrun"), "--standalone", "--nproc-per-node", str(np_)]
    run_env = mpi_env({"OMP_NUM_THREADS": "1", **(env or {})})
    proc = subprocess.Popen(
        cmd + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env, cwd=ROOT
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        for p in [*tree, proc]:
            try:
                p.kill()
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def python_cmd(*args):
    return [sys.executable, *args]


def bno_cmd(*args):
    return [sys.executable, "-m", "bno_hvd", *args]


def run_cli(*args, timeout=120, env=None):
    """``bno-hvd ARGS`` in a plain (non-MPI) subprocess."""
    return subprocess.run(bno_cmd(*args), capture_output=True, text=True, timeout=timeout, env=mpi_env(env), cwd=ROOT)


def assert_ok(proc):
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-4000:]}"
    )
