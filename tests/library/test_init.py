"""``bno.init()``, the drop-in for ``hvd.init()`` (bno_hvd/library/start.py): on 4 real ranks
under mpirun, Horovod's collectives run on MPI where no rank has a CPU limit and on Gloo where
ranks run under one set outside the job (real cgroups, made before the job as a container's are:
bno_hvd/lab/confine.py); either way ``hvd``'s own functions answer as after ``hvd.init()``, an
allreduce sums, and rank 0 says once why it chose Gloo; the Horovod example on Gloo trains exactly
as one process does. A wrong argument is one line on every rank."""

import json
import re

import pytest
import torch
from support.cgroups import needs_cgroups
from support.checks import max_relative_difference
from support.jobs import FASHION_DIR, assert_ok, mpirun, python_cmd
from support.port_twin import EXAMPLE
from support.run_port import write_fashion_subset

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


@needs_cgroups
def test_the_port_on_gloo_under_limits_set_outside_equals_one_process(tmp_path, fashion_available):
    """The Horovod example (bno.init() in its port) on 4 ranks under CPU limits set outside the
    job, so Horovod's allreduce runs on Gloo, with a random changing split, against one process."""
    data = write_fashion_subset(tmp_path / "data", FASHION_DIR, train=240, test=40)
    args = ["--epochs", "1", "--strategy", "random", "--log-interval", "1000", "--seed", "5", "--data-dir", data]
    runs = {}
    for name, np_, batch, lr in (("four", 4, "4", "0.01"), ("one", 1, "16", "0.04")):
        out = tmp_path / name
        out.mkdir()
        cmd = python_cmd("tests/support/run_port.py", str(out), EXAMPLE, *args, "--batch-size", batch, "--lr", lr)
        if np_ == 4:
            with Confinement(BY_NAME["outside-equal-10ms"]) as confined:
                proc = mpirun(4, python_cmd("-m", "bno_hvd.lab.confine", *cmd), env=confined, timeout=400)
        else:
            proc = mpirun(1, cmd, timeout=400)
        assert_ok(proc)
        runs[name] = (proc, torch.load(out / "model.pt", weights_only=True))
    assert "bno-hvd: note: Horovod's collectives run on Gloo" in runs["four"][0].stderr
    sizes = [json.loads((tmp_path / "four" / f"sizes-{r}.json").read_text()) for r in range(4)]
    assert sum(len(set(s)) > 1 for s in zip(*sizes)) >= 10  # uneven splits
    diff = max_relative_difference(runs["four"][1], runs["one"][1])
    print(f"4 ranks on Gloo vs 1 process: max relative parameter difference {diff:.2e}")
    assert diff <= 1e-12
