"""Gloo must not widen what a job exposes: Horovod's rendezvous store (HTTP, no authentication)
listens on the interface Gloo uses (127.0.0.1 on one host) and only until every rank has joined."""

import re
import shutil
import subprocess
import time

import pytest
from support.jobs import ROOT, bno_cmd, mpi_env

from bno_hvd.cli.launching import mpirun_command

pytestmark = pytest.mark.mpi

NOTE = re.compile(r"rendezvous on ([\d.]+):(\d+) until every rank joined")


def listening(port: int) -> list[str]:
    """``ss``'s lines of TCP sockets listening on ``port`` (any address)."""
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if re.search(rf"[:\]]{port}\s", line + " ")]


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2, installed by launch/setup)")
def test_the_rendezvous_store_listens_on_loopback_and_closes_after_start_up(tmp_path):
    cmd = bno_cmd("train", "--updates", "100", "--no-eval", "--no-progress", "--collectives", "gloo")
    cmd += ["--dataset", "synthetic", "--log-dir", str(tmp_path)]
    proc = subprocess.Popen(
        mpirun_command(2, cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env(), cwd=ROOT
    )
    try:
        found = None
        deadline = time.monotonic() + 240
        for line in proc.stderr:  # rank 0 prints the note after hvd.init(), when every rank has joined
            found = NOTE.search(line) or found
            if found or time.monotonic() > deadline:
                break
        assert found, "rank 0 printed no Gloo note"
        address, port = found.group(1), int(found.group(2))
        assert address == "127.0.0.1"  # one host: the loopback interface, never 0.0.0.0
        still = listening(port)
        assert proc.poll() is None, "the job ended before the sockets could be read"
        assert still == [], f"the rendezvous store still listens after start-up: {still}"
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
