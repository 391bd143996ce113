"""Ranks that share cores: bno-hvd sets Open MPI's yield-when-idle itself before MPI starts,
says so once, and leaves a user's own choice alone (busy-polling ranks cost balanced 2.40x -> 2.18x
equal here, EMULATED 1,1,1,0.33)."""

import subprocess
import sys

import pytest
from support.jobs import ROOT

from bno_hvd.cli import launching
from bno_hvd.processes import mpienv
from bno_hvd.processes.mpienv import YIELD, arrange_for_shared_cores


def test_more_ranks_than_cores_sets_yield_and_says_so():
    environ = {"OMPI_COMM_WORLD_LOCAL_SIZE": str(mpienv.usable_cores() + 1)}
    note = arrange_for_shared_cores(environ)
    assert environ[YIELD] == "1"
    assert YIELD in note and "share" in note


@pytest.mark.parametrize(
    "environ",
    [
        {"OMPI_COMM_WORLD_LOCAL_SIZE": "1"},  # one rank: nothing shares a core
        {"OMPI_COMM_WORLD_LOCAL_SIZE": "999", YIELD: "0"},  # the user chose
        {},  # not under a launcher we know
    ],
)
def test_yield_left_alone(environ):
    before = dict(environ)
    assert arrange_for_shared_cores(environ) is None
    assert environ == before


def run_on_one_core(env_changes: dict, drop: tuple = ()) -> subprocess.CompletedProcess:
    """2 ranks under mpirun pinned to one core (taskset: the ranks inherit the affinity), so they
    share it whatever the machine has."""
    env = mpienv.mpi_env(extra=env_changes)
    for name in drop:
        env.pop(name, None)
    cmd = [
        "taskset",
        "-c",
        "0",
        *launching.mpirun_command(2, [sys.executable, "tests/support/mpi_scripts/shared_cores.py"]),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)


@pytest.mark.mpi
def test_plain_mpirun_without_the_setting_gets_it_on_every_rank():
    proc = run_on_one_core({}, drop=(YIELD,))
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rank in (0, 1):
        assert f"rank {rank}: {YIELD}=1 notes=1" in proc.stdout, proc.stdout
    notes = [line for line in proc.stderr.splitlines() if line.startswith("bno-hvd: note:")]
    assert len(notes) == 1 and "2 ranks share 1 core on" in notes[0], proc.stderr[-2000:]


@pytest.mark.mpi
def test_a_users_own_yield_setting_is_kept():
    proc = run_on_one_core({YIELD: "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rank in (0, 1):
        assert f"rank {rank}: {YIELD}=0 notes=0" in proc.stdout, proc.stdout
    assert "bno-hvd: note:" not in proc.stderr
