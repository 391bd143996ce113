"""``bno.init()``, the drop-in for ``hvd.init()`` (bno_hvd/library/start.py): on 4 real ranks
under mpirun, Horovod's collectives run on MPI where no rank has a CPU limit and on Gloo where
ranks run under one set outside the job (real cgroups, made before the job as a container's are:
bno_hvd/lab/confine.py); either way ``hvd``'s own functions answer as after ``hvd.init()``, an
allreduce sums, and rank 0 says once why it chose Gloo. A wrong argument is one line on every rank."""

import re

import pytest
from support.cgroups import needs_cgroups
from support.jobs import assert_ok, mpirun, python_cmd

from bno_hvd.lab.profiles import BY_NAME, Confinement

pytestmark = pytest.mark.mpi

SCRIPT = """
import os, sys, torch
import horovod.torch as hvd
import bno_hvd as bno
bno.init(*sys.argv[1:])
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
print(f"rank {hvd.rank()} of {hvd.size()}: {os.environ.get('HOROVOD_CPU_OPERATIONS', 'mpi')} sum {total:g}")
"""


def run(tmp_path, *args, env=None, confine=False):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    cmd = python_cmd(str(script), *args)
    if confine:
        cmd = python_cmd("-m", "bno_hvd.lab.confine", *cmd)
    return mpirun(4, cmd, env=env, timeout=180)


def lines(proc):
    return sorted(re.findall(r"rank \d of \d: \w+ sum [\d.]+", proc.stdout))


def test_without_a_cpu_limit_horovod_runs_on_mpi(tmp_path):
    proc = run(tmp_path)
    assert_ok(proc)
    assert lines(proc) == [f"rank {r} of 4: mpi sum 10" for r in range(4)]
    assert "Gloo" not in proc.stderr


@needs_cgroups
def test_under_a_cpu_limit_set_outside_horovod_runs_on_gloo(tmp_path):
    with Confinement(BY_NAME["outside-equal-10ms"]) as confined:
        proc = run(tmp_path, env=confined, confine=True)
    assert_ok(proc)
    assert lines(proc) == [f"rank {r} of 4: gloo sum 10" for r in range(4)]
    assert proc.stderr.count("bno-hvd: note: Horovod's collectives run on Gloo") == 1
    assert "ranks run under a CPU limit" in proc.stderr


def test_mpi_may_be_asked_for_and_a_wrong_choice_is_one_line(tmp_path):
    assert_ok(proc := run(tmp_path, "mpi"))
    assert lines(proc) == [f"rank {r} of 4: mpi sum 10" for r in range(4)]
    proc = run(tmp_path, "nccl")
    assert proc.returncode == 2
    assert proc.stderr.count("bno-hvd: error: bno.init: collectives is one of auto, mpi, gloo, got 'nccl'") == 1
    assert "Traceback" not in proc.stderr
