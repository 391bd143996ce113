"""Exact BatchNorm through the library, and the loss scale of a rank back from sitting out
(``tests/support/mpi_scripts/exact_cases.py`` runs every case in one job on 4 ranks, every
reference in one job on 1 process; the module's tests read their cases' results). The 4-rank
job's last case, the MLP's drop-in without ``bno.exact``, must end it in torch's refusal.

- the drop-in (``bno.DataLoader``, ``bno.DistributedOptimizer``, ``bno.exact``): torchvision's
  ``resnet18`` (4 updates) and an MLP with ``BatchNorm1d`` (12), a split that changes every 2
  updates with a rank at 1 sample, equal one process within 1e-10 (parameters and running statistics, float64); without
  ``bno.exact`` the MLP's BatchNorm1d refuses the rank's batch of 1 (``bno-hvd train`` with
  ``--local-batchnorm`` shows how far off resnet18 is: ``test_exact_batchnorm.py``); the same
  through the DDP drop-in (``bno.DistributedDataParallel``, whose hook weights the gradients:
  before BatchNorm's backward knew that frame, 2.5 for resnet18 and 4.6 for the MLP);
- a rank that sits out (0 samples, so it runs no forward: the BatchNorm allreduces run over the
  others' process set) and comes back: equal one process, every computing rank's state equal at
  every update;
- several ranks that sit out at once (up to 3 of 4, five sets of ranks in turn), on
  Horovod's dynamic process sets (over MPI and over Gloo) and on torch.distributed's groups:
  equal one process;
- float16 and bfloat16 autocast with ``torch.amp.GradScaler("cpu")`` and a sit-out: every rank's
  scale and state equal at every update at which it computes (the scale moves while rank 3 is out).
"""

import json
from pathlib import Path

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import FASHION_DIR, assert_ok, mpirun, python_cmd
from support.run_port import write_fashion_subset

from bno_hvd.processes.sitsets import LIVE

pytestmark = pytest.mark.mpi

SCRIPT = "tests/support/mpi_scripts/exact_cases.py"


@pytest.fixture(scope="module")
def data(tmp_path_factory, fashion_available):
    return write_fashion_subset(tmp_path_factory.mktemp("fashion"), FASHION_DIR, train=1000, test=10)


FOUR = ["dropin:resnet18", "dropin:mlp", "sitout:mlp", "multisit:mlp", "float16:mlp", "bfloat16:mlp"]
ONE = ["dropin:resnet18:plain", "dropin:mlp:plain", "sitout:mlp"]  # the references: torch's own BatchNorm
REFUSED = "Expected more than 1 value per channel when training"  # torch's BatchNorm1d, a rank at 1 sample


def run_job(np_, out, data, cases):
    out.mkdir()
    proc = mpirun(np_, python_cmd(SCRIPT, data, str(out), *cases), timeout=600)
    cases = [c for c in cases if not c.startswith("--")]  # (--engine=torch: the job's engine)
    done = [c for c in cases if (out / c.replace(":", "-") / "updates.json").exists()]
    assert done == [c for c in cases if not c.endswith(":plain") or np_ == 1], proc.stderr[-4000:]
    return out, proc


@pytest.fixture(scope="module")
def four(data, tmp_path_factory):
    return run_job(4, tmp_path_factory.mktemp("exact") / "four", data, [*FOUR, "dropin:mlp:plain"])


@pytest.fixture(scope="module")
def four_ddp(data, tmp_path_factory):
    """The DDP drop-in (torch.distributed on Gloo, bno.DistributedDataParallel): its hook weights each
    rank's gradients, so exact BatchNorm's backward must work in that frame."""
    out, proc = run_job(
        4, tmp_path_factory.mktemp("exact") / "ddp", data, ["--dropin=ddp", "dropin:resnet18", "dropin:mlp"]
    )
    assert_ok(proc)
    return out, proc


@pytest.fixture(scope="module")
def four_torch(data, tmp_path_factory):
    out, proc = run_job(4, tmp_path_factory.mktemp("exact") / "torch", data, ["--engine=torch", "multisit:mlp"])
    assert_ok(proc)
    return out


@pytest.fixture(scope="module")
def four_gloo(data, tmp_path_factory):
    out, proc = run_job(4, tmp_path_factory.mktemp("exact") / "gloo", data, ["--collectives=gloo", "multisit:mlp"])
    assert_ok(proc)
    return out


@pytest.fixture(scope="module")
def one(data, tmp_path_factory):
    out, proc = run_job(1, tmp_path_factory.mktemp("exact") / "one", data, ONE)
    assert_ok(proc)
    assert "Traceback" not in proc.stderr
    return out


def result(job, case):
    out = job if isinstance(job, Path) else job[0]
    where = out / case.replace(":", "-")
    return torch.load(where / "model.pt", weights_only=True), json.loads((where / "updates.json").read_text())


def running_stats(state):
    return {k: v for k, v in state.items() if "running_" in k}


@pytest.mark.parametrize("dropin", ["horovod", "ddp"])
@pytest.mark.parametrize("model,updates", [("resnet18", 4), ("mlp", 12)])
def test_the_drop_in_with_exact_batchnorm_equals_one_process(dropin, model, updates, request, one):
    job = request.getfixturevalue({"horovod": "four", "ddp": "four_ddp"}[dropin])
    proc = job[1]
    four, rows = result(job, f"dropin:{model}")
    one, _ = result(one, f"dropin:{model}:plain")
    sizes = [r["sizes"] for r in rows]
    assert len(sizes) == updates and all(1 in s and sum(s) == 16 for s in sizes)
    assert len({tuple(s) for s in sizes}) == updates // 2, sizes  # a new split every 2 updates
    assert all(max(r["diff"]) == 0 for r in rows)  # every rank holds the same state after every update
    diff = max_relative_difference(four, one)
    stats = max_relative_difference(running_stats(four), running_stats(one))
    print(f"{dropin} drop-in {model}: 4 ranks vs 1 process {diff:.2e} (running statistics {stats:.2e})")
    assert running_stats(one) and diff <= 1e-10 and stats <= 1e-10
    # without bno.exact, the rank at 1 sample cannot even train: the Horovod job's last case
    if model == "mlp" and dropin == "horovod":
        assert proc.returncode != 0 and REFUSED in proc.stderr, proc.stderr[-4000:]


def test_a_rank_sits_out_with_exact_batchnorm_and_training_stays_exact(four, one):
    four, rows = result(four, "sitout:mlp")
    one, _ = result(one, "sitout:mlp")
    out = [u for u, r in enumerate(rows[:-1]) if r["sizes"][3] == 0]
    assert len(out) >= 4 and 1 in [r["sizes"][3] for r in rows[max(out) + 1 :]], [r["sizes"] for r in rows]
    assert all(not r["computed"][3] for r in rows if r["sizes"][3] == 0)
    for r in rows:  # the ranks that computed hold rank 0's state, bit for bit
        assert all(d == 0 for d, c in zip(r["diff"], r["computed"]) if c), r
    assert any(r["diff"][3] > 0 for r in rows if not r["computed"][3])  # behind while out (the check can fail)
    diff = max_relative_difference(four, one)
    print(f"sit-out with exact BatchNorm: 4 ranks vs 1 process {diff:.2e}")
    assert diff <= 1e-10


@pytest.mark.parametrize("engine", ["horovod", "horovod-gloo", "torch"])
def test_several_ranks_sit_out_at_once_and_training_stays_exact(engine, request, one):
    job = {"horovod": "four", "horovod-gloo": "four_gloo", "torch": "four_torch"}[engine]
    four, rows = result(request.getfixturevalue(job), "multisit:mlp")
    one, _ = result(one, "sitout:mlp")  # (one process: the same 16-sample global batches)
    out = [tuple(i for i, b in enumerate(r["sizes"]) if b == 0) for r in rows[:-1]]
    assert {(1, 3), (2,), (1, 2, 3), (1, 2), (3,)} <= set(out), out  # up to three of four ranks at once
    for r in rows:  # the ranks that computed hold rank 0's state, bit for bit; those out did not compute
        assert all(d == 0 for d, c in zip(r["diff"], r["computed"]) if c) and r["computed"][0], r
        assert all(not c for b, c in zip(r["sizes"], r["computed"]) if b == 0), r
    assert any(r["diff"][i] > 0 for r in rows for i in (1, 2, 3) if not r["computed"][i])  # behind while out
    # the third set of several ranks out (Horovod: of any, torch) removed the least recently used of LIVE
    assert max(r["sets"] for r in rows) == LIVE and all(r["sets"] <= LIVE for r in rows), [r["sets"] for r in rows]
    diff = max_relative_difference(four, one)
    print(f"{engine}: several ranks out at once with exact BatchNorm, 4 ranks vs 1 process {diff:.2e}")
    assert diff <= 1e-10


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_loss_scale_travels_with_a_rank_back_from_sitting_out(dtype, four):
    _, rows = result(four, f"{dtype}:mlp")
    out = [u for u, r in enumerate(rows[:-1]) if r["sizes"][3] == 0]
    assert out and max(out) + 1 < len(rows) - 1
    scales = [r["scales"][0] for r in rows]
    assert scales[max(out)] != scales[min(out) - 1], scales  # the scale moved while rank 3 was out
    for u, r in enumerate(rows):
        computing = [i for i, c in enumerate(r["computed"]) if c]
        assert len({r["scales"][i] for i in computing}) == 1, (u, r)
        assert all(r["diff"][i] == 0 for i in computing), (u, r)
