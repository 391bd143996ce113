"""``bno.elastic``: the DDP drop-in of a user's script (``examples/ddp_elastic.py``) under the
elastic agent (``bno-hvd elastic -n N -- python script.py``), on Fashion-MNIST in float64: workers
killed (SIGKILL) mid-run, rank 2 then rank 0; one more joining (SIGUSR1 to the agent), then rank 0
asked to leave (SIGTERM). Every job: exit 0, the ledger check passes (no sample lost or
repeated), and the final parameters equal the plain port (examples/ddp_mnist.py) in one process on
the same global batches (max relative difference <= 1e-10), while the split changes at every
update (``--strategy random``, a rank at 1 sample)."""

import signal
import subprocess
import sys

import pytest
from support.checks import max_relative_difference
from support.elastic_jobs import FAULT_SEEDS, ElasticJob, check_paused_rejoined, committed, random_schedule
from support.jobs import FASHION_DIR, ROOT, assert_ok, mpi_env, mpirun, python_cmd, run_cli
from support.port_twin import DDP_EXAMPLE, example_source, plain_twin, port_markers
from support.run_port import write_fashion_subset
from support.train_runs import saved_model
from test_elastic import recoveries

from bno_hvd.common.errors import UsageError

ELASTIC_EXAMPLE = f"{ROOT}/examples/ddp_elastic.py"
WITH_BATCHNORM = "tests/support/mpi_scripts/with_batchnorm.py"  # the example's Net with BatchNorm2d
TRAIN, GLOBAL = 2000, 16  # 125 updates of 16 per epoch
ARGS = ["--strategy", "random", "--rebalance-every", "1", "--seed", "5", "--log-interval", "50"]


@pytest.fixture(scope="module")
def data(tmp_path_factory, fashion_available):
    return write_fashion_subset(tmp_path_factory.mktemp("ddp-elastic-data"), FASHION_DIR, train=TRAIN, test=100)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, data):
    """The plain port (examples/ddp_mnist.py) in one process on the whole global batch (16, lr 4 x
    0.01), for a number of epochs: its final parameters."""
    made = {}

    def reference(epochs, batchnorm=False):
        if (epochs, batchnorm) not in made:
            out = tmp_path_factory.mktemp("ddp-elastic-one")
            args = [*ARGS, "--epochs", str(epochs), "--data-dir", data, "--batch-size", str(GLOBAL), "--lr", "0.04"]
            script = [WITH_BATCHNORM, DDP_EXAMPLE] if batchnorm else [DDP_EXAMPLE]  # torch's own BatchNorm
            cmd = ["tests/support/run_port.py", str(out), *script, *args]
            assert_ok(mpirun(1, python_cmd("-m", "bno_hvd.processes.torchenv", *cmd), timeout=300))
            made[epochs, batchnorm] = saved_model(out / "model.pt")
        return made[epochs, batchnorm]

    return reference


def script_command(out, data, epochs, log, batchnorm=False, timeout=5) -> list[str]:
    """A worker's command: the example under tests/support/run_port.py (rank 0 saves ``out/model.pt``)."""
    example = [WITH_BATCHNORM, "--exact", ELASTIC_EXAMPLE] if batchnorm else [ELASTIC_EXAMPLE]  # bno.exact
    script = [sys.executable, "tests/support/run_port.py", str(out), *example, *ARGS, "--data-dir", data]
    script += ["--epochs", str(epochs)]
    script += ["--batch-size", "4", "--global-batch", str(GLOBAL), "--lr", "0.01", "--elastic-timeout", str(timeout)]
    return [*script, "--log-dir", str(log)]


def elastic_job(tmp_path, data, nproc, epochs, batchnorm=False, timeout=5):
    out = tmp_path / "out"
    out.mkdir()
    script = script_command(out, data, epochs, tmp_path / "elastic", batchnorm, timeout)
    job = ElasticJob(tmp_path, data, nproc=nproc, script=script, timeout=150)
    job.model, job.epochs = out / "model.pt", epochs
    return job


def check_job(job, one_process, schedule):
    """``one_process``: the reference's parameters; the updates follow from the ledger's length."""
    code, err = job.finish()
    events = f"schedule {schedule}: {job.events}; generations {job.generations()}\n{err[-3000:]}"
    assert code == 0, events
    check = run_cli("ledger", "check", str(job.log))
    assert check.returncode == 0, f"{check.stderr}\n{events}"
    updates = job.epochs * TRAIN // GLOBAL
    assert check.stdout.startswith(f"ledger ok: {updates} updates used {updates * GLOBAL} samples"), check.stdout
    diff = max_relative_difference(saved_model(job.model), one_process)
    print(f"{schedule}: max relative difference {diff:.2e} to one process; {job.events}")
    assert diff <= 1e-10, f"max relative difference {diff:.3e}; {events}"
    entries = committed(job.log)
    assert any(1 in e["sizes"] for e in entries), f"no rank ever had a single sample; {events}"
    return entries


@pytest.mark.mpi
@pytest.mark.alone  # a collective's timeout tells a death: no other test's load beside it
def test_a_killed_worker_is_dropped_and_the_ddp_script_stays_exact(tmp_path, data, one_process):
    schedule = [(40, "kill", 2), (120, "kill", 0)]
    job = elastic_job(tmp_path, data, 4, epochs=2)  # 250 updates
    job.run_schedule(schedule)
    entries = check_job(job, one_process(2), schedule)
    members = [tuple(e["members"]) for e in entries]
    assert len(members[-1]) == 2 and len(set(members)) == 3, sorted(set(members))
    took = recoveries(job, entries)  # measured, not asserted: a speed figure
    print(f"{schedule}: kill -> next committed update {', '.join(f'{t:.2f}' for t in took)} s")


@pytest.mark.mpi
@pytest.mark.alone
def test_a_worker_joins_then_rank_0_leaves_and_the_ddp_script_stays_exact(tmp_path, data, one_process):
    job = elastic_job(tmp_path, data, 2, epochs=3)  # 375 updates: the joiner starts (seconds) before the end
    job.run_schedule([(5, "join", None)])
    schedule = [(5, "join", None), (len(committed(job.log)) + 20, "term", 0)]  # rank 0 asked to leave after
    job.run_schedule(schedule[1:])
    entries = check_job(job, one_process(3), schedule)
    members = [tuple(e["members"]) for e in entries]
    assert members[0] == (0, 1) and len(set(members)) == 3 and members[-1] == (1, 2), sorted(set(members))
    joined = members.index((0, 1, 2))
    assert all(e["sizes"][2] > 0 for e in entries[joined : members.index((1, 2))])  # the newcomer computes at once
    tests = (tmp_path / "agent.out").read_text().count("test set: mean loss")  # a join or a leave waits for the
    assert tests == 3, f"{tests} evaluations in 3 epochs"  # next update: after an epoch's last, its evaluation


@pytest.mark.mpi
@pytest.mark.alone
def test_a_join_published_during_the_last_update_lets_the_job_finish_and_evaluate(tmp_path, data, one_process):
    """The matrix's seed 0 on a fast machine (CI of 7093354): the job's last update ran as a joiner's
    generation was published. Here both workers are stopped (SIGSTOP) in their last update until the
    agent publishes the joiner, then resumed: before that update's start they form the generation with
    the joiner, which trains it; past it, they finish and evaluate, and the joiner ends with 0. Before,
    they left at the last update's optimizer step, skipped the last evaluation, and formed a generation
    with nothing left to train with the joiner, which never ran the model (its run_port.py failed)."""
    job = elastic_job(tmp_path, data, 2, epochs=1, timeout=60)  # no collective times out while stopped
    assert job.wait_updates(TRAIN // GLOBAL - 1), "the job ended before its last update"
    workers = list(job.workers().values())
    for worker in workers:
        worker.suspend()
    job.proc.send_signal(signal.SIGUSR1)
    job.events.append("join at the last update")
    published = job.wait_generation(2, limit=120)
    for worker in workers:
        worker.resume()
    assert published, open(job.err_path).read()
    entries = check_job(job, one_process(1), [])
    tests = (tmp_path / "agent.out").read_text().count("test set: mean loss")
    assert tests == 1, f"{tests} evaluations in 1 epoch; {job.events}"
    print(f"the last update's members {entries[-1]['members']}; {open(job.err_path).read().splitlines()[-1]}")


@pytest.mark.mpi
@pytest.mark.alone
def test_batchnorm_through_bno_elastic_stays_exact_across_a_kill_and_a_join(tmp_path, data, one_process):
    """``bno.exact`` in the elastic script (its Net with BatchNorm2d, made exact again in each
    generation): the batch statistics span the generation's members, and a joiner receives the
    running statistics with the parameters. Torch's own BatchNorm in the same job: 0.92."""
    schedule = [(40, "kill", 2), (100, "join", None)]
    job = elastic_job(tmp_path, data, 4, epochs=2, batchnorm=True)  # 250 updates
    job.run_schedule(schedule)
    entries = check_job(job, one_process(2, batchnorm=True), schedule)
    members = [tuple(e["members"]) for e in entries]
    assert members[0] == (0, 1, 2, 3) and members[-1] == (0, 1, 3, 4), sorted(set(members))


@pytest.mark.mpi
@pytest.mark.alone
def test_a_worker_paused_while_a_generation_forms_is_left_out_and_the_ddp_script_stays_exact(
    tmp_path, data, one_process
):
    """As a joiner's generation is published, rank 1 stops (SIGSTOP) past --elastic-timeout: that
    generation does not form, the others ask for it again (``reform``) and the agent publishes them
    without the worker that did not arrive; resumed, it joins again. Before: the others ended
    ('no new membership') and the paused worker went on alone."""
    schedule = [(40, "join-pause", 1)]
    # 500 updates: the joiner started in 19 s beside 4 busy workers on 2 cores, then the 4 ran the 67 updates
    # left of 250 in 1.1 s and finished before the paused worker, resumed, was back (2026-12-01, a fast machine)
    job = elastic_job(tmp_path, data, 4, epochs=4)
    job.run_schedule(schedule)
    entries = check_job(job, one_process(4), schedule)
    check_paused_rejoined(job, entries)


@pytest.mark.mpi
@pytest.mark.alone
@pytest.mark.parametrize("seed", FAULT_SEEDS)
def test_the_fault_matrix_on_the_ddp_script(seed, tmp_path, data, one_process):
    """The seeded schedules of ``--elastic``'s matrix (tests/training/test_elastic_matrix.py:
    kills, two at once, rank 0, during a re-formation, leaves, joins, a rank that rejoins) on the
    script of ``bno.elastic``, 3 epochs (375 updates: a joiner starts, seconds, before the end)."""
    schedule = random_schedule(seed, 3 * TRAIN // GLOBAL)
    job = elastic_job(tmp_path, data, 4, epochs=3)
    job.run_schedule(schedule)
    entries = check_job(job, one_process(3), schedule)
    print(f"seed {seed}: {job.events}; recoveries {[round(t, 2) for t in recoveries(job, entries)]} s")


def test_the_elastic_port_is_the_ddp_port_moved_into_a_function_plus_its_marked_lines():
    """Every unmarked line of examples/ddp_elastic.py is a line of examples/ddp_mnist.py or of its
    plain twin (moved into fit(), not changed), each 'was' line is one of the plain DDP script's,
    and the docstring counts the marked lines: 19, ddp_mnist.py's 8 (2 of them changed) and 11 more."""
    source, port = example_source(ELASTIC_EXAMPLE), example_source(DDP_EXAMPLE)
    marks, twin = port_markers(source), {line.strip() for line in plain_twin(port).splitlines()}
    theirs = twin | {line.strip() for line in port.splitlines()}
    start = source.index('"""', 3) + 3  # after the docstring
    first = source[:start].count("\n")
    lines = source.splitlines()
    changed = [line for i, line in enumerate(lines) if i > first and i not in marks and line.strip() not in theirs]
    assert not changed, changed
    assert all(was in twin for was in marks.values() if was is not None), marks
    beyond = [lines[i] for i in marks if lines[i].strip() not in theirs]  # not a line of ddp_mnist.py's port
    assert (len(marks), len(port_markers(port)), len(beyond)) == (19, 8, 13), (len(marks), beyond)
    assert "19 lines" in source[:start]


@pytest.mark.slow
def test_a_script_of_bno_elastic_without_the_agent_is_one_line(data):
    proc = subprocess.run(
        [sys.executable, ELASTIC_EXAMPLE, "--data-dir", data, "--epochs", "1"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=mpi_env(),
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("bno-hvd: error: @bno.elastic.run needs the elastic agent"), lines


def test_bno_elastic_refuses_what_it_cannot_carry_in_one_line():
    import torch

    import bno_hvd as bno

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UsageError, match="^bno.elastic.State needs a torch optimizer"):
        bno.elastic.State(model, "sgd")
    with pytest.raises(UsageError, match="timeout is in seconds"):
        bno.elastic.State(model, optimizer, timeout=0)
    state = bno.elastic.State(model, optimizer)
    with pytest.raises(UsageError, match="belongs inside the function decorated with @bno.elastic.run"):
        state.epochs(None, 1)
    with pytest.raises(UsageError, match="takes the bno.elastic.State first"):
        bno.elastic.run(lambda state: None)(model)
    assert state.epoch == 1 and list(range(state.epoch, 3)) == [1, 2]
