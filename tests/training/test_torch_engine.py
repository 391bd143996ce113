"""The torch engine: the control plane over torch.distributed (torchrun, no MPI), and ``bno-hvd
train --engine torch`` (DistributedDataParallel with the weighting hook) under torchrun and under
mpirun, against one process on the whole global batch."""

import json

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import assert_ok, bno_cmd, mpirun, run_cli, torchrun
from support.train_runs import saved_model, train_args


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 4])
def test_control_plane_over_torch_distributed(np_, tmp_path):
    proc = torchrun(np_, ["tests/support/mpi_scripts/control_plane_torch.py", str(tmp_path)], timeout=180)
    assert_ok(proc)
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(r["rank"] for r in records) == list(range(np_))
    assert all(r["failures"] == [] for r in records), records
    assert len({tuple(r["sizes"]) for r in records}) == 1


def train(launcher, np_, batch_sizes, path, tmp_path, data, extra=()):
    log_dir = tmp_path / f"log-{launcher}-{np_}"
    flags = ["--engine", "torch", "--data-dir", data, "--strategy", "fixed", "--batch-sizes", batch_sizes, *extra]
    args = train_args(path, log_dir, *flags, updates=4, momentum=0.9)
    if launcher == "torchrun":
        proc = torchrun(np_, ["-m", "bno_hvd", *args], timeout=180)
    elif np_ == 1:
        proc = run_cli(*args, timeout=400)
    else:
        proc = mpirun(np_, bno_cmd(*args), timeout=400)
    assert_ok(proc)
    return proc, saved_model(path)


@pytest.fixture(scope="module")
def single(tmp_path_factory, fashion_dir):
    """The reference of both launchers: one process on all 32 samples (a plain process, a world of
    one rank; which launcher started it cannot change its updates)."""
    where = tmp_path_factory.mktemp("torch-engine-one")
    return train("plain", 1, "32", where / "single.pt", where, fashion_dir)[1]


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_train_with_the_torch_engine_equals_one_process(launcher, tmp_path, single, fashion_dir):
    """Uneven ranks, three of them over their memory caps (5 -> 4+1, 11 -> 4+4+3, 13 -> 5+5+3
    samples: DDP's allreduce waits for each rank's last pass), equal one process on all 32."""
    caps = ["--max-batch", "4,4,16,5"]
    proc, multi = train(launcher, 4, "5,11,3,13", tmp_path / "multi.pt", tmp_path, fashion_dir, caps)
    diff = max_relative_difference(multi, single)
    print(f"--engine torch under {launcher}: max relative difference {diff:.3e}")
    assert diff <= 1e-9
    run = json.loads((tmp_path / f"log-{launcher}-4" / "run.json").read_text())
    assert run["collectives"] == "gloo" and run["world_size"] == 4
    plane = "MPI" if launcher == "mpirun" else "Gloo (torch.distributed)"
    assert f"gradients summed by torch.distributed over gloo, the control plane on {plane}" in proc.stderr

    from bno_hvd.data.models import build_model

    torch.manual_seed(7)
    init = build_model("cnn").to(torch.float64).state_dict()
    assert max_relative_difference(single, init) > 1e-3  # training moved the parameters


@pytest.mark.mpi
def test_the_torch_engine_is_exact_with_batchnorm(tmp_path):
    """BatchNorm over the global batch (bno-hvd's default) with the torch engine: its allreduces go
    through torch.distributed (Horovod is not initialised); 4 ranks whose uneven split changes at
    every update, a rank at 1 sample, == 1 process (plain BatchNorm) on the same global batches."""
    model = ["--engine", "torch", "--dataset", "synthetic", "--model", "tests.support.user_model:small_bn"]
    split = ["--strategy", "random", "--rebalance-every", "1", "--base-batch-size", "2"]
    multi = train_args(tmp_path / "multi.pt", tmp_path / "multi", *model, *split, updates=3, momentum=0.9)
    assert_ok(mpirun(4, bno_cmd(*multi), timeout=300))
    one = ["--strategy", "fixed", "--batch-sizes", "8", "--local-batchnorm"]
    assert_ok(run_cli(*train_args(tmp_path / "one.pt", tmp_path / "one", *model, *one, updates=3, momentum=0.9)))
    sizes = [json.loads(line)["batch_sizes"] for line in open(tmp_path / "multi" / "updates.jsonl")]
    assert len(sizes) == 3 and any(1 in s for s in sizes) and len({tuple(s) for s in sizes}) > 1, sizes
    a, b = saved_model(tmp_path / "multi.pt"), saved_model(tmp_path / "one.pt")
    assert "2.running_mean" in a and max_relative_difference(a, b) <= 1e-10


@pytest.mark.mpi
def test_the_torch_engine_measures_each_ranks_emulated_compute(tmp_path):
    """A fast rank's compute phase is its own (an EMULATED device of 200 samples/s at speed 1 beside
    one at 0.25): every update's measured compute is at least its emulated time. (DDP reduced the
    gradients inside backward(): the fast rank's backward waited for the slow one, its emulation
    then predicted no wait, and it measured its bare forward and backward, 18 ms against 162.)"""
    log_dir = tmp_path / "log"
    flags = ["--engine", "torch", "--strategy", "fixed", "--batch-sizes", "8,8"]
    flags += ["--emulate-speed", "1,0.25", "--emulate-rate", "200", "--dtype", "float32"]
    assert_ok(mpirun(2, bno_cmd(*train_args(tmp_path / "m.pt", log_dir, *flags, updates=6)), timeout=300))
    ranks = json.loads((log_dir / "ranks.json").read_text())["ranks"]
    for speed, rank in zip([1, 0.25], ranks):
        emulated = [batch / (speed * 200) for batch in rank["batch"]]
        assert len(emulated) == 6 and all(c >= e * 0.99 for c, e in zip(rank["compute"], emulated)), (speed, rank)


@pytest.mark.mpi
def test_the_control_planes_groups_wait_as_long_as_the_jobs_default_group(tmp_path):
    """A TorchComm's own group (and its Dup's) takes the default group's timeout (3 s here), not
    torch's 30 minutes: under --elastic a survivor whose peer is stuck elsewhere fails within
    --elastic-timeout and the next generation forms (with torch's default, rank 0 waits and the job
    is killed at 120 s)."""
    proc = torchrun(2, ["tests/support/mpi_scripts/torchcomm_timeout.py", str(tmp_path)], timeout=120)
    assert_ok(proc)
    got = json.loads((tmp_path / "rank0.json").read_text())
    assert got["comm"][0] == got["dup"][0] == "RuntimeError", got
    print(f"rank 0's bcast with rank 1 away: failed after {got['comm'][1]:.1f} s and {got['dup'][1]:.1f} s")
