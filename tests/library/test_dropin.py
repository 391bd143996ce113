"""The drop-in surface for a Horovod script (bno_hvd.DataLoader, bno_hvd.DistributedOptimizer,
exact_dropout): the update of the whole global batch under uneven splits, and one line for
what cannot be exact. Under mpirun (real Horovod, 4 or 2 ranks), and the dropout masks alone.
The gradient cases and the refusals share one 4-rank job (a job's start-up costs more than its cases)."""

import re
import subprocess
import time

import pytest
import torch
import torch.nn.functional as F
from support.jobs import ROOT, mpirun, python_cmd

from bno_hvd.cli import launching
from bno_hvd.common.errors import UsageError
from bno_hvd.library.dropout import SampleDropout
from bno_hvd.processes import mpienv
from bno_hvd.processes.world import EXIT_WAIT_SECONDS

SCRIPT = "tests/support/mpi_scripts/dropin_cases.py"
RANKS = ["0", "1", "2", "3"]


@pytest.fixture(scope="module")
def grads_then_refusals():
    """One 4-rank job: the gradient cases, then the refusals (the last of which ends the job)."""
    return mpirun(4, python_cmd(SCRIPT, "grads", "refusals"), timeout=300)


@pytest.mark.mpi
def test_gradients_are_the_global_batch_gradient_on_uneven_changing_ranks(grads_then_refusals):
    proc = grads_then_refusals
    for case in ("op=average passes=1", "op=sum passes=1", "op=average passes=2", "batches+lr", "adasum-even"):
        # mpirun may put two ranks' lines on one (a tag between a line and its newline): find, not split
        ranks = re.findall(rf"rank (\d): {re.escape(case)}: ok", proc.stdout)
        assert sorted(ranks) == RANKS, proc.stdout[-3000:] + proc.stderr[-3000:]


REFUSED = {  # case of the script -> what its one line says (in the script's order; the last ends the job)
    "adasum": "op=hvd.Adasum cannot give the sample-weighted mean of uneven batches",
    "predivide": "gradient_predivide_factor=2",
    "torch-loader": "the balancer is not a torch sampler",
    "memory-cap": "a memory cap (max_batch=, max_tokens=) splits a rank's batch into micro-batches",
    "foreign-loader": "a batch that did not come from the balancer",
}


@pytest.mark.mpi
def test_what_cannot_be_exact_is_refused_with_one_line(grads_then_refusals):
    """After the gradient cases, the refusals one after another: every rank raises each but the
    last alike (a one-line UsageError of exit code 2 that no rank found alone, which the one-line
    hook prints once); the last, not caught, ends the job with one line and exit code 2."""
    proc = grads_then_refusals
    text = proc.stdout + proc.stderr
    *caught, last = REFUSED
    for case in caught:
        said = re.findall(rf"rank (\d): {case} refused: (.*)", proc.stdout)
        assert sorted(r for r, _ in said) == RANKS and all(REFUSED[case] in m for _, m in said), text[-3000:]
    errors = [line for line in text.splitlines() if "bno-hvd: error:" in line]
    assert proc.returncode == 2, text[-3000:]
    assert len(errors) == 1 and REFUSED[last] in errors[0], text[-3000:]
    assert "Traceback" not in text and "was not refused" not in text and "NOT alike" not in text


@pytest.mark.mpi
def test_a_script_on_shared_cores_without_yield_when_idle_is_told_once():
    """MPI starts in the user's hvd.init(), before bno-hvd could set OMPI_MCA_mpi_yield_when_idle:
    for_world says so in one note (2 ranks pinned to one core, the setting dropped)."""
    env = mpienv.mpi_env()
    env.pop(mpienv.YIELD)
    cmd = ["taskset", "-c", "0", *launching.mpirun_command(2, python_cmd(SCRIPT, "note"))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    notes = [line for line in proc.stderr.splitlines() if line.startswith("bno-hvd: note:")]
    assert len(notes) == 1 and "OMPI_MCA_mpi_yield_when_idle is not set" in notes[0], proc.stderr[-2000:]
    assert proc.stdout.count("balancer for 50 samples, 25 of them here") == 2


@pytest.mark.mpi
def test_a_rank_that_ends_first_waits_for_the_others_before_horovod_finalizes_mpi():
    """The script's hvd.init() started MPI, so Horovod finalizes it, on every rank once any rank
    shuts Horovod down: rank 0 ends at once while rank 1 still uses the balancer's comm 3 s later
    (it crashed in MPI there before rank 0 waited at its exit)."""
    proc = mpirun(2, python_cmd(SCRIPT, "late"), timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rank 1: late, 2 ranks" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.mpi
def test_a_rank_that_dies_of_an_exception_does_not_wait_for_the_others_at_its_exit():
    """The others may be waiting for it in an allreduce: its exit must shut Horovod down at once
    (their allreduce then fails), not after the exit wait."""
    proc = mpirun(2, python_cmd(SCRIPT, "crash"), timeout=180)
    ended = time.time()
    raised = re.search(r"rank 1: raising at ([0-9.]+)", proc.stdout)
    assert proc.returncode != 0 and raised, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "[1,1]<stderr>:Traceback" in proc.stderr  # its end may be cut: mpirun ends the job
    assert ended - float(raised.group(1)) < EXIT_WAIT_SECONDS, "the failed rank waited for the others"


class Net(torch.nn.Module):
    """Horovod's example's shape: Dropout2d on a feature map, F.dropout on a vector."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 3, 3)
        self.drop2d = torch.nn.Dropout2d(0.4)
        self.fc = torch.nn.Linear(3 * 4 * 4, 5)

    def forward(self, x):
        x = self.drop2d(self.conv(x))
        return F.dropout(self.fc(x.flatten(1)), p=0.3, training=self.training)


def forward(model, x, keys, seed=0):
    with SampleDropout(lambda: keys, seed):
        return model(x)


def same(a, b):
    """The same masks (zeros in the same places) and the same values up to float32 summation order:
    BLAS may sum a batch of 6 and one of 2 in different blocks (seen: last-bit differences)."""
    return torch.equal(a == 0, b == 0) and torch.allclose(a, b, rtol=1e-6, atol=1e-7)


def test_dropout_masks_follow_the_sample_not_the_split():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(6, 1, 6, 6)
    keys = [(0, 11), (0, 4), (1, 7), (1, 0), (0, 9), (2, 3)]
    whole = forward(model, x, keys)
    halves = torch.cat([forward(model, x[:2], keys[:2]), forward(model, x[2:], keys[2:])])
    assert same(whole, halves)  # the same sample meets the same masks in any split
    reordered = forward(model, x.flip(0), keys[::-1]).flip(0)
    assert same(whole, reordered)
    assert not same(whole, forward(model, x, [(e + 1, i) for e, i in keys]))  # a new epoch, new masks
    assert not same(whole, forward(model, x, keys, seed=1))
    assert (whole == 0).any() and (whole != 0).any()
    # torch's own dropout draws one stream per call: a split changes what a sample meets
    torch.manual_seed(1)
    plain_whole = model(x)
    torch.manual_seed(1)
    plain_halves = torch.cat([model(x[:2]), model(x[2:])])
    assert not same(plain_whole, plain_halves)


def test_dropout_outside_training_is_untouched_and_refusals_are_one_line():
    model, x = Net(), torch.randn(3, 1, 6, 6)
    model.eval()
    with SampleDropout(lambda: [], 0):  # no keys needed: eval dropout is the identity
        assert torch.equal(model(x), Net.forward(model, x))
    model.train()
    with pytest.raises(UsageError, match="has 2 samples; run the model on the whole batch"):
        forward(model, x, [(0, 1), (0, 2)])
    with pytest.raises(UsageError, match="not alpha_dropout"):
        forward(lambda t: F.alpha_dropout(t, 0.5, training=True), x, [(0, 1), (0, 2), (0, 3)])
