"""bno-hvd in PyTorch Lightning (``bno.lightning.BalancedStrategy``, docs/lightning.md).

- exact: ``examples/lightning_mnist.py`` (a CNN with BatchNorm and two dropouts), run unchanged in
  float64 under torchrun on 4 ranks whose random, uneven split changes every 2 updates (a rank at 1
  sample among them), trains exactly as the same script in one process on the whole global batch
  (parameters and BatchNorm's running statistics); with plain DDP's mean over the ranks in place
  of the weighting hook (tests/support/unweighted.py) it does not;
- Lightning's own launcher (``python script.py``: Lightning starts the ranks) runs it too and logs
  every rank's batch size through the Trainer's logger; so does Slurm (``srun`` in an sbatch
  script, on a private cluster of tests/support/slurm_cluster.py), as exact as under torchrun;
- so does the script with Lightning's ``sync_batchnorm=True``; with ``local_batchnorm=True``
  BatchNorm stays per rank (it trains, and no longer as one process);
- a run resumed from a checkpoint taken mid-epoch equals the uninterrupted run;
- what BalancedStrategy refuses is one ``bno-hvd: error:`` line and exit 2 on every rank.
"""

import csv
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import FASHION_DIR, ROOT, TORCHRUN_EXIT_HANG, assert_ok, mpi_env, torchrun
from support.run_port import write_fashion_subset
from support.slurm_fixture import running_cluster

EXAMPLE = os.path.join(ROOT, "examples", "lightning_mnist.py")
ARGS = ["--epochs", "2", "--strategy", "random", "--rebalance-every", "2", "--seed", "5", "--lr", "0.05"]


def run_lightning(np_, out, args, runner="tests/support/run_port.py"):
    """The example on ``np_`` ranks under torchrun through ``runner`` (float64; each rank's batch
    sizes and rank 0's final ``Net`` kept)."""
    out.mkdir()
    cmd = [runner, str(out), EXAMPLE, "--devices", str(np_), "--log-dir", str(out / "logs"), *args]
    proc = torchrun(np_, cmd, timeout=300, done=[out / f"done-{r}" for r in range(np_)])
    assert_ok(proc)
    sizes = [json.loads((out / f"sizes-{r}.json").read_text()) for r in range(np_)]
    return proc, torch.load(out / "model.pt", weights_only=True), sizes


def logged_batch_sizes(logs) -> dict[int, tuple]:
    """Rank 0's CSV log: the step of each row that logs the four batch sizes, and the sizes."""
    [metrics] = list(logs.glob("lightning_logs/version_*/metrics.csv"))
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("bno/batch_size/rank0")]
    return {int(r["step"]): tuple(int(float(r[f"bno/batch_size/rank{k}"])) for k in range(4)) for r in rows}


@pytest.fixture(scope="module")
def data(tmp_path_factory, fashion_available):
    return write_fashion_subset(tmp_path_factory.mktemp("lightning-data"), FASHION_DIR, train=500, test=100)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, data):
    """The reference: the example in one process on the whole global batch of 16."""
    where = tmp_path_factory.mktemp("lightning-one")
    return run_lightning(1, where / "one", [*ARGS, "--data-dir", data, "--batch-size", "16"])


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_4_uneven_ranks_equal_one_process_and_plain_ddp_reduction_does_not(tmp_path, data, one_process):
    _, single, single_sizes = one_process
    four = [*ARGS, "--data-dir", data, "--batch-size", "4"]
    proc, multi, sizes = run_lightning(4, tmp_path / "four", four)

    per_update = list(zip(*sizes))
    assert len(per_update) == len(single_sizes[0]) == 32 + 31  # the global batches that start in each epoch
    assert all(sum(s) == 16 for s in per_update) and set(single_sizes[0]) == {16}
    assert sum(len(set(s)) > 1 for s in per_update) > 50  # uneven in (nearly) every update
    assert sum(a != b for a, b in zip(per_update, per_update[1:])) >= 25  # a new split every 2 updates
    assert any(1 in s for s in per_update)  # a rank at 1 sample (BatchNorm's statistics: the global batch's)
    assert any("running_mean" in k for k in single)
    rel = max_relative_difference(multi, single)
    print(f"lightning: 4 ranks vs 1 process: max relative difference {rel:.2e}")
    assert rel <= 1e-10
    assert "Traceback" not in proc.stderr
    logged = logged_batch_sizes(tmp_path / "four" / "logs")  # through the Trainer's logger, as the split changes
    assert logged == dict(enumerate(per_update)), (logged, per_update)  # each step's row: that step's split

    _, unweighted, plain_sizes = run_lightning(4, tmp_path / "unweighted", four, runner="tests/support/unweighted.py")
    assert plain_sizes == sizes  # the same batches; only the reduction differs
    off = max_relative_difference(unweighted, single)
    print(f"lightning: plain DDP mean over ranks: max relative difference {off:.2e}")
    assert off > 1e-3


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_lightnings_sync_batchnorm_under_the_strategy_stays_exact(tmp_path, data, one_process):
    """``Trainer(sync_batchnorm=True)`` makes the BatchNorm a SyncBatchNorm before the strategy wraps
    the model; ``bno.exact`` turns it into the global batch's exact BatchNorm (SyncBatchNorm's own
    backward would not follow the weighting hook's frame)."""
    _, single, _ = one_process
    args = [*ARGS, "--data-dir", data, "--batch-size", "4", "--sync-batchnorm"]
    _, multi, sizes = run_lightning(4, tmp_path / "four", args)
    assert any(1 in s for s in zip(*sizes))
    rel = max_relative_difference(multi, single)
    print(f"lightning with sync_batchnorm: 4 ranks vs 1 process: max relative difference {rel:.2e}")
    assert rel <= 1e-10


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_local_batchnorm_keeps_each_ranks_statistics_and_so_leaves_one_process(tmp_path, data, one_process):
    """``BalancedStrategy(local_batchnorm=True)`` (the example's ``--local-batchnorm``): BatchNorm by
    each rank's own batch, as Lightning's DDP; the same uneven splits (a rank at 1 sample) then
    train, but no longer as one process (the exact run of the same splits is, test above)."""
    _, single, _ = one_process
    args = [*ARGS, "--data-dir", data, "--batch-size", "4", "--local-batchnorm"]
    proc, multi, sizes = run_lightning(4, tmp_path / "four", args)
    assert any(1 in s for s in zip(*sizes)) and "Traceback" not in proc.stderr
    assert all(torch.isfinite(v).all() for v in multi.values())
    rel = max_relative_difference(multi, single)
    print(f"lightning with local_batchnorm: 4 ranks vs 1 process: max relative difference {rel:.2e}")
    assert rel > 1e-6


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_a_run_resumed_from_a_mid_epoch_checkpoint_equals_the_uninterrupted_one(tmp_path, data):
    """5 epochs of 500 samples in global batches of 16: 32, 31, 31, 31 and 32 updates (a global
    batch that crosses an epoch's end belongs to the one it starts in). Resumed in the second, the
    run goes through a longer epoch than its own: each epoch trains all its updates."""
    four = [*ARGS, "--data-dir", data, "--batch-size", "4", "--epochs", "5"]
    _, whole, whole_sizes = run_lightning(4, tmp_path / "whole", four)
    assert len(whole_sizes[0]) == 32 + 31 + 31 + 31 + 32
    _, _, first_sizes = run_lightning(4, tmp_path / "first", [*four, "--max-steps", "40", "--checkpoint-every", "37"])
    checkpoint = tmp_path / "first" / "logs" / "epoch=1-step=37.ckpt"
    assert checkpoint.exists(), sorted(os.listdir(tmp_path / "first" / "logs"))
    _, resumed, rest_sizes = run_lightning(4, tmp_path / "resumed", [*four, "--resume", str(checkpoint)])

    # updates 0..39 ran first; the resumed run trains 37..156 on the batches the uninterrupted one did
    assert [s[:37] + r for s, r in zip(first_sizes, rest_sizes)] == whole_sizes
    rel = max_relative_difference(resumed, whole)
    print(f"lightning: resumed vs uninterrupted: max relative difference {rel:.2e}")
    assert rel <= 1e-12


@pytest.mark.slow
def test_lightning_launches_the_ranks_itself_and_logs_each_ranks_batch_size(tmp_path, data):
    """``python examples/lightning_mnist.py``: Lightning's launcher starts 3 more ranks (4 in all)."""
    logs = tmp_path / "logs"
    args = ["--data-dir", data, "--batch-size", "8", "--epochs", "1", "--log-dir", str(logs)]
    proc = subprocess.run(
        [sys.executable, EXAMPLE, *args, "--strategy", "fixed:11,8,12,1", "--max-steps", "6"],
        capture_output=True,
        text=True,
        timeout=300,
        env=mpi_env({"OMP_NUM_THREADS": "1"}),
        cwd=tmp_path,
    )
    assert_ok(proc)
    assert "Traceback" not in proc.stderr and "test_accuracy" in proc.stdout
    [metrics] = list(logs.glob("lightning_logs/version_*/metrics.csv"))
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("bno/batch_size/rank0")]
    assert len(rows) == 6  # logged at the first update (the split never changes); Lightning keeps it in every row
    assert {tuple(float(r[f"bno/batch_size/rank{k}"]) for k in range(4)) for r in rows} == {(11.0, 8.0, 12.0, 1.0)}


REFUSALS = {
    "rank 0 at 0 samples": (["--strategy", "fixed:0,8,8,16"], "rank 0's >= 1"),
    "a changing global batch": (["--strategy", "bno"], "strategy bno changes the global batch"),
    "local and synced BatchNorm": (["--local-batchnorm", "--sync-batchnorm"], "local_batchnorm=True keeps BatchNorm"),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_what_balanced_strategy_refuses_is_one_line_and_exit_2_on_every_rank(case, tmp_path, data):
    extra, line = REFUSALS[case]
    out = tmp_path / "out"
    cmd = ["tests/support/run_port.py", str(out), EXAMPLE, "--data-dir", data, "--batch-size", "8", *extra]
    out.mkdir()
    proc = torchrun(4, [*cmd, "--log-dir", str(out)], timeout=180)
    assert proc.returncode != 0
    errors = [x for x in proc.stderr.splitlines() if x.startswith("bno-hvd: error:")]
    assert len(errors) == 1 and line in errors[0], proc.stderr[-3000:]
    ranks = [line for line in proc.stderr.splitlines() if line.strip().startswith("exitcode  :")]
    codes = [int(line.split(":")[1].split()[0]) for line in ranks]
    # torchrun reports every rank: 2, or its SIGTERM (-15) to the ranks still tearing down once one exited
    assert len(codes) == 4 and 2 in codes and set(codes) <= {2, -15}, proc.stderr[-3000:]
    # no rank's traceback: the one there is torchrun's own report of the failed job
    assert proc.stderr.count("Traceback (most recent call last)") == 1 and "UsageError" not in proc.stderr


CONSTRUCTION = {
    "text": (
        {"lengths": [3, 5]},
        "text split by cost (lengths=, cost=, global_tokens=) is not supported by bno.lightning yet",
    ),
    "micro": ({"max_batch": 8}, "a memory cap (max_batch=) runs micro-batches, which Lightning's loop does not"),
    "hook": ({"ddp_comm_hook": print}, "BalancedStrategy registers its own DDP communication hook"),
    "spawn": ({"start_method": "spawn"}, "start_method='spawn' is not supported by BalancedStrategy"),
    "local_batchnorm": ({"local_batchnorm": "yes"}, "local_batchnorm must be True or False, got 'yes'"),
}


@pytest.mark.parametrize("case", sorted(CONSTRUCTION))
def test_what_balanced_strategy_refuses_when_built_is_one_usage_error(case):
    from bno_hvd.common.errors import UsageError
    from bno_hvd.library.frameworks.lightning import BalancedStrategy

    options, line = CONSTRUCTION[case]
    with pytest.raises(UsageError, match=re.escape(line)):
        BalancedStrategy(**options)


def test_a_loss_scale_is_refused_in_one_line(capsys, monkeypatch):
    from lightning.pytorch.plugins import MixedPrecision

    from bno_hvd.library.frameworks.lightning import BalancedStrategy

    monkeypatch.delenv("RANK", raising=False)  # this process is rank 0: it says the line
    scaler = torch.amp.GradScaler("cpu")
    strategy = BalancedStrategy(precision_plugin=MixedPrecision("16-mixed", "cpu", scaler=scaler))
    line = "a loss scale (precision='16-mixed', its GradScaler) is not supported by BalancedStrategy yet"
    with pytest.raises(SystemExit) as exited:
        strategy.setup(None)
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(f"bno-hvd: error: {line}")


@pytest.mark.slow
def test_a_script_refused_when_it_builds_the_strategy_exits_2_with_one_line(tmp_path):
    code = "import bno_hvd as bno; bno.lightning.BalancedStrategy(lengths=[1, 2])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=mpi_env())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "bno-hvd: error: text split by cost (lengths=, cost=, global_tokens=) is not supported by bno.lightning "
        "yet; use the DDP drop-in (docs/text.md)"
    ]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    yield from running_cluster(str(tmp_path_factory.mktemp("slurm")), {"node0": 4}, {"debug": ["node0"]})


@pytest.mark.mpi
@pytest.mark.slurm
def test_under_srun_the_example_equals_one_process(slurm, tmp_path, data, one_process):
    """Launched as Lightning runs under Slurm: an sbatch script whose ``srun`` starts the 4 processes
    (Lightning's SLURMEnvironment takes the ranks from srun), uneven splits that change every 2
    updates, a rank at 1 sample. The cluster's node is a name for this host, so the job sets
    MASTER_ADDR (on a real cluster Lightning resolves the first node of SLURM_NODELIST)."""
    out = tmp_path / "four"
    out.mkdir()
    run = [sys.executable, os.path.join(ROOT, "tests", "support", "run_port.py"), str(out), EXAMPLE]
    run += ["--devices", "4", "--log-dir", str(out / "logs"), *ARGS, "--data-dir", data, "--batch-size", "4"]
    script = tmp_path / "lightning.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=4\n#SBATCH --cpus-per-task=1\n"
        f"export MASTER_ADDR=127.0.0.1\nexec srun --kill-on-bad-exit=1 {shlex.join(run)}\n"
    )
    job = slurm.sbatch([str(script)], cwd=str(tmp_path), env={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert job.exit_code == 0, f"job {job.job_id} exit {job.exit_code}:\n{job.output[-4000:]}\n{job.sbatch_stderr}"
    assert "Traceback" not in job.output, job.output[-4000:]
    sizes = [json.loads((out / f"sizes-{r}.json").read_text()) for r in range(4)]
    per_update = list(zip(*sizes))
    assert all(sum(s) == 16 for s in per_update) and min(min(s) for s in per_update) == 1
    assert sum(a != b for a, b in zip(per_update, per_update[1:])) >= 25  # a new split every 2 updates
    diff = max_relative_difference(torch.load(out / "model.pt", weights_only=True), one_process[1])
    print(f"lightning under srun: 4 processes vs 1 process: max relative difference {diff:.2e}")
    assert diff <= 1e-10
