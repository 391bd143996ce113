"""The Slurm batch scripts for real: a private Slurm cluster on this machine runs them.

tests/support/slurm_cluster.py starts munged, slurmctld and three slurmd "nodes" from Debian's packages
(launch/setup installs them), with everything in a temporary directory and on free ports:
``node0`` (4 CPUs, partition ``debug``, the default) for the ordinary job, ``nodeA`` and ``nodeB``
(2 CPUs each, partitions ``gpu-new`` and ``gpu-old``, as in launch/slurm-hetjob.sbatch) for the
heterogeneous one. The module's fixture stops every daemon and removes the directory again, also
when a test fails or is interrupted; where Slurm cannot run here, the tests skip and say why.
"""

import json
import os
import re

import pytest
from support.jobs import ROOT
from support.slurm_cluster import SlurmError
from support.slurm_fixture import running_cluster

pytestmark = [pytest.mark.mpi, pytest.mark.slurm]

BATCH = os.path.join(ROOT, "launch", "slurm.sbatch")
HETJOB = os.path.join(ROOT, "launch", "slurm-hetjob.sbatch")
SHORT_RUN = ["--dataset", "synthetic", "--updates", "10", "--base-batch-size", "8", "--latency-interval", "0"]
SHORT_RUN += ["--no-progress"]
# Each job's processes start with this environment (sbatch exports it): one torch thread per rank.
JOB_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = {"node0": 4, "nodeA": 2, "nodeB": 2}
    partitions = {"debug": ["node0"], "gpu-new": ["nodeA"], "gpu-old": ["nodeB"]}
    yield from running_cluster(str(tmp_path_factory.mktemp("slurm")), nodes, partitions)


def train_records(log_dir):
    run = json.loads((log_dir / "run.json").read_text())
    updates = [json.loads(line) for line in (log_dir / "updates.jsonl").read_text().splitlines()]
    return run, updates


def assert_trained(job, log_dir, world_size=4, updates=10):
    assert job.exit_code == 0, f"job {job.job_id} exit {job.exit_code}:\n{job.output[-4000:]}\n{job.sbatch_stderr}"
    assert re.search(rf"^test accuracy: [0-9.]+ .* after {updates} updates", job.output, re.M), job.output[-4000:]
    run, records = train_records(log_dir)
    assert run["world_size"] == world_size
    assert [r["update"] for r in records] == list(range(updates))
    assert all(len(r["batch_sizes"]) == world_size for r in records)


def error_lines(output):
    return [line for line in output.splitlines() if "error" in line.lower()]


def test_batch_script_trains_four_ranks_with_srun(cluster, tmp_path):
    log_dir = tmp_path / "log"
    job = cluster.sbatch([BATCH, *SHORT_RUN, "--log-dir", str(log_dir)], cwd=str(tmp_path), env=JOB_ENV)
    assert_trained(job, log_dir)
    assert f"[slurm] job {job.job_id}: 4 ranks" in job.output


def test_train_flags_from_the_environment_and_mpirun_launcher(cluster, tmp_path):
    """BNO_TRAIN_ARGS carries the flags; BNO_SLURM_LAUNCHER=mpirun starts the ranks instead of srun;
    sbatch's --ntasks overrides the script's."""
    log_dir = tmp_path / "log"
    env = dict(JOB_ENV, BNO_TRAIN_ARGS=" ".join(SHORT_RUN[:-1]), BNO_SLURM_LAUNCHER="mpirun")
    args = ["--ntasks=2", BATCH, "--no-progress", "--updates", "5", "--log-dir", str(log_dir)]
    job = cluster.sbatch(args, cwd=ROOT, env=env)
    assert_trained(job, log_dir, world_size=2, updates=5)  # the script's own --updates comes last and wins
    assert f"[slurm] job {job.job_id}: 2 ranks" in job.output


def test_bad_train_flag_fails_the_job_with_one_line(cluster, tmp_path):
    job = cluster.sbatch([BATCH, *SHORT_RUN, "--strategy", "fastest"], cwd=str(tmp_path), env=JOB_ENV)
    assert job.exit_code != 0
    errors = error_lines(job.output)
    assert len(errors) == 1 and errors[0].startswith("bno-hvd: error:"), job.output
    assert "fastest" in errors[0]
    assert "test accuracy" not in job.output and "[slurm]" not in job.output  # nothing was launched


def test_missing_venv_fails_the_job_with_one_line(cluster, tmp_path):
    env = dict(JOB_ENV, BNO_VENV=str(tmp_path / "no-venv"))
    job = cluster.sbatch([BATCH, *SHORT_RUN], cwd=str(tmp_path), env=env)
    assert job.exit_code == 2
    errors = error_lines(job.output)
    assert len(errors) == 1 and errors[0].startswith("bno-hvd: error: no virtual environment"), job.output
    assert str(tmp_path / "no-venv") in errors[0] and "launch/setup" in errors[0]


def test_heterogeneous_job_is_one_mpi_world(cluster, tmp_path):
    """Two components (2 tasks on nodeA in gpu-new, 2 on nodeB in gpu-old): ONE world of 4 ranks
    and one control plane, launched by srun --het-group=0-1 --mpi=pmix."""
    log_dir = tmp_path / "log"
    # Both "nodes" are this machine: Open MPI's shared-memory transport names its segments by
    # hostname and local rank, which the two components share, so use TCP between them (on
    # real nodes, which have their own /dev/shm, leave it alone).
    # The TCP BTL on the loopback interface only: both components are on this host.
    env = dict(JOB_ENV, OMPI_MCA_btl="tcp,self", OMPI_MCA_btl_tcp_if_include="lo")
    # The timeout catches srun's hang (below) early, yet must not cut a job that is only slow on a
    # busy machine: 3x an ordinary 4-rank job of the same run on this cluster, timed now.
    if not cluster.job_seconds:
        assert_trained(
            cluster.sbatch([BATCH, *SHORT_RUN, "--log-dir", str(tmp_path / "plain")], cwd=str(tmp_path), env=JOB_ENV),
            tmp_path / "plain",
        )
    timeout = max(90.0, 3 * max(cluster.job_seconds))
    job = None
    for attempt in range(3):
        log_dir = tmp_path / f"log{attempt}"
        try:
            args = [HETJOB, *SHORT_RUN, "--log-dir", str(log_dir)]
            job = cluster.sbatch(args, cwd=str(tmp_path), env=env, timeout=timeout)
            if job.exit_code != 0 and "failed to TCP connect to a peer" in job.output and attempt < 2:
                # Seen once with two busy processes beside the suite: Open MPI 4.1's TCP wire-up
                # between the components timed out (connect() EINPROGRESS) and a rank crashed in it
                # (open-mpi/ompi#11508: timeouts of an overloaded host). Retried like the hang below.
                continue
            break
        except SlurmError as err:
            # Slurm 22.05 here: in about 1 of 6 runs srun --het-group never returns although both
            # components' steps are "done with job" in their slurmd logs and training finished.
            # Only that case is retried (and must not repeat three times); anything else fails.
            if "still waiting" not in str(err) or not (log_dir / "result.json").exists():
                raise
            cluster.cancel_all()
    assert job is not None, "srun --het-group hung after the job finished in 3 of 3 attempts"
    assert_trained(job, log_dir)
    assert f"[slurm] job {job.job_id}: 4 ranks" in job.output and "(--het-group=0-1)" in job.output
    for offset, node in enumerate(("nodeA", "nodeB")):  # each component ran its part of the step on its node
        log = open(os.path.join(cluster.workdir, "log", f"slurmd-{node}.log")).read()
        assert f"launch task {job.job_id}+{offset}.0 " in log, f"component {offset} not on {node}:\n{log[-2000:]}"
