"""An elastic job under Slurm loses a node and goes on: ``sbatch launch/slurm.sbatch --elastic``.

A private Slurm cluster (tests/support/slurm_cluster.py) with three 2-CPU nodes in one partition;
a job over all three, two workers per node: launch/slurm-job starts node 0's agent in the batch
step and the other nodes' agents with srun. Mid-run node ``n2`` is lost: its slurmd and every
process of the job on it are killed at once, as when a machine fails. The job goes on with the
four workers left and ends with exit 0; the ledger check passes (no sample lost or repeated),
and the final parameters equal one process on the same global batches.
"""

import os
import signal
import threading

import pytest
from support.checks import max_relative_difference
from support.elastic_jobs import GLOBAL, committed, reference
from support.jobs import ROOT, run_cli
from support.slurm_fixture import running_cluster
from support.train_runs import saved_model, train_args

pytestmark = [pytest.mark.mpi, pytest.mark.slurm]

BATCH = os.path.join(ROOT, "launch", "slurm.sbatch")
UPDATES = 200
NODES = {"n0": 2, "n1": 2, "n2": 2}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from running_cluster(str(tmp_path_factory.mktemp("slurm-elastic")), NODES, {"all": list(NODES)})


def job_pids(node: str) -> list[int]:
    """The job's processes on ``node`` (its tasks carry SLURMD_NODENAME): the agent and its workers."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if f"SLURMD_NODENAME={node}".encode() in fh.read().split(b"\0"):
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def lose_node(cluster, node: str) -> list[int]:
    """The machine fails: its slurmd and the job's processes on it, SIGKILL at once."""
    pids = job_pids(node) + [cluster.procs[f"slurmd-{node}"].pid]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    cluster.procs[f"slurmd-{node}"].wait(timeout=10)
    return pids


def test_an_elastic_job_loses_a_node_and_goes_on(cluster, tmp_path, fashion_dir, tmp_path_factory):
    one = saved_model(reference(tmp_path_factory.mktemp("slurm-one"), fashion_dir, UPDATES))
    log = tmp_path / "log"
    flags = ["--engine", "torch", "--elastic", "--data-dir", fashion_dir, "--global-batch", str(GLOBAL)]
    flags += ["--strategy", "random", "--rebalance-every", "1", "--elastic-timeout", "5"]
    args = train_args(tmp_path / "elastic.pt", log, *flags, updates=UPDATES)[1:]  # (after "train")
    result = {}

    def submit():
        options = ["--nodes=3", "--ntasks-per-node=2", "--ntasks=6", "--cpus-per-task=1", "--no-kill"]
        result["job"] = cluster.sbatch([*options, BATCH, *args], cwd=str(tmp_path), env={"OMP_NUM_THREADS": "1"})

    thread = threading.Thread(target=submit, daemon=True)
    thread.start()
    deadline = threading.Event()
    while len(committed(log)) < 40 and thread.is_alive():
        deadline.wait(0.1)
    assert thread.is_alive(), f"the job ended before update 40: {result}"
    killed = lose_node(cluster, "n2")
    thread.join(timeout=240)
    job = result.get("job")
    assert job is not None, "sbatch did not return within 240 s"
    assert job.exit_code == 0, f"job {job.job_id} exit {job.exit_code} (killed {killed}):\n{job.output[-4000:]}"
    assert "ended (node 2 lost)" in job.output, job.output[-4000:]
    check = run_cli("ledger", "check", str(log))
    assert check.returncode == 0, f"{check.stderr}\n{job.output[-3000:]}"
    assert check.stdout.startswith(f"ledger ok: {UPDATES} updates used {UPDATES * GLOBAL} samples"), check.stdout
    entries = committed(log)
    assert len(entries[0]["members"]) == 6 and len(entries[-1]["members"]) == 4, (entries[0], entries[-1])
    diff = max_relative_difference(saved_model(tmp_path / "elastic.pt"), one)
    assert diff <= 1e-10, f"max relative difference {diff:.3e}\n{job.output[-3000:]}"
