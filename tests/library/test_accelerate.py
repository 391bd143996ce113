"""Hugging Face Accelerate (``bno.accelerate``, docs/accelerate.md): ``examples/accelerate_mnist.py``.

- The example is a plain Accelerate script with its port marked as the DDP example's is
  (``tests/support/port_twin.py``): the twin differs in the marked lines alone (at most 8), keeps
  every lint rule and trains under torchrun with Accelerate's own sharded loader.
- The example, run unchanged on 4 processes whose random, uneven split changes every 2 updates
  (a process at 1 sample), trains exactly as one process does on the whole global batch (float64,
  its ``Net`` with BatchNorm and two dropouts made exact by ``bno.exact``); without the weighting
  hook (Accelerate's own ``Accelerator``) or without ``bno.exact`` the same runs are not exact.
- What a balanced Accelerate script cannot do is refused in one line, with a non-zero exit on
  every process (``tests/support/mpi_scripts/accelerate_refusals.py``).
"""

import difflib
import json
import os
import re

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import FASHION_DIR, ROOT, TORCHRUN_EXIT_HANG, VENV_BIN, assert_ok, python_cmd, torchrun
from support.port_twin import example_source, lint_failures, plain_twin, port_diff, port_markers
from support.run_port import write_fashion_subset
from support.slurm_cluster import free_ports

EXAMPLE = f"{ROOT}/examples/accelerate_mnist.py"
ARGS = ["--cpu", "--epochs", "2", "--strategy", "random", "--log-interval", "8", "--seed", "5"]
TRAIN = 200  # samples: ceil(200/16) = 13 global batches, then 12 (the stream goes on where it stood)


def assert_marked_lines_alone(source: str) -> list[str]:
    """The twin differs from ``source`` in its marked lines alone, each as its marker says; returns the twin."""
    marks = port_markers(source)
    example, twin = source.splitlines(), plain_twin(source).splitlines()
    assert 1 <= len(marks) <= 8, len(marks)
    compile("\n".join(twin), "twin", "exec")
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, twin, example, autojunk=False).get_opcodes():
        if tag != "equal":
            assert all(j in marks for j in range(j1, j2)), example[j1:j2]  # an unmarked line differs
            was = [marks[j] for j in range(j1, j2) if marks[j] is not None]
            assert [line.strip() for line in twin[i1:i2]] == was, (twin[i1:i2], was)
    code = [line for line in twin if not line.lstrip().startswith("#")]
    assert not any(re.search(r"\bbno\.", line) for line in code)
    return twin


def test_the_accelerate_twin_differs_from_the_example_in_the_marked_lines_alone():
    source = example_source(EXAMPLE)
    twin = assert_marked_lines_alone(source)
    body = source[source.index("def train(") : source.index("def main(")]
    assert "# bno-hvd" not in body  # the loop and the evaluation stay Accelerate's
    assert "accelerator = Accelerator(cpu=args.cpu)" in [line.strip() for line in twin]
    assert any("accelerator.prepare(model, optimizer, train_loader, test_loader)" in line for line in twin)
    assert any("DataLoader(train_set, batch_size=args.batch_size, shuffle=True)" in line for line in twin)


def test_docs_show_the_accelerate_port_as_it_is():
    with open(f"{ROOT}/docs/accelerate.md") as fh:
        page = fh.read()
    assert port_diff(example_source(EXAMPLE), name="examples/accelerate_mnist.py", plain="Accelerate") in page
    assert "torchrun --nproc-per-node 4 examples/accelerate_mnist.py --cpu" in page


@pytest.mark.slow
def test_the_accelerate_twin_and_the_example_keep_every_lint_and_format_rule():
    failures = lint_failures(EXAMPLE)
    assert not failures, failures


def run_accelerate(np_, out, script, args, without=None, launcher=None):
    """``script`` on ``np_`` processes under torchrun (or ``launcher``) through
    tests/support/run_port.py (float64; sizes and the final model kept), or run_without.py with a
    mechanism taken out."""
    out.mkdir()
    runner = ["tests/support/run_port.py"] if without is None else ["tests/support/run_without.py", without]
    done = [out / f"done-{r}" for r in range(np_)]
    proc = torchrun(np_, [*runner, str(out), str(script), *args], timeout=300, done=done, launcher=launcher)
    assert_ok(proc)
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    sizes = [json.loads((out / f"sizes-{r}.json").read_text()) for r in range(np_)]
    return proc, torch.load(out / "model.pt", weights_only=True), sizes


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_the_plain_accelerate_twin_trains_under_torchrun(tmp_path, fashion_available):
    """The 'before' of the port is a working Accelerate script: its DataLoaderShard gives every
    process an even part (2 processes show it as 4 do)."""
    data = write_fashion_subset(tmp_path / "data", FASHION_DIR, train=256, test=128)
    twin = tmp_path / "plain_accelerate_mnist.py"
    twin.write_text(plain_twin(example_source(EXAMPLE)))
    args = ["--cpu", "--epochs", "1", "--batch-size", "32", "--log-interval", "2", "--data-dir", data]
    proc, model, sizes = run_accelerate(2, tmp_path / "out", twin, args)
    assert sizes == [[32] * 4] * 2  # 256 / 2 processes / 32 = 4 steps of 32 samples in each
    assert all(f"process {r}, epoch 1, step 2/4: 96 samples" in proc.stdout for r in range(2))
    assert proc.stdout.count("test set: mean loss") == 1
    assert "bno-hvd" not in proc.stderr
    assert all(torch.isfinite(t).all() for t in model.values())


@pytest.fixture(scope="module")
def data(tmp_path_factory, fashion_available):
    return write_fashion_subset(tmp_path_factory.mktemp("accelerate-data"), FASHION_DIR, train=TRAIN, test=100)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, data):
    """The reference: the example in one process on the whole global batch (16, lr 4 x 0.01)."""
    args = [*ARGS, "--data-dir", data, "--batch-size", "16", "--lr", "0.04", "--rebalance-every", "2"]
    return run_accelerate(1, tmp_path_factory.mktemp("accelerate-one") / "one", EXAMPLE, args)


def four(data):
    return [*ARGS, "--data-dir", data, "--batch-size", "4", "--lr", "0.01", "--rebalance-every", "2"]


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_the_accelerate_port_on_4_uneven_processes_equals_one_process(tmp_path, data, one_process):
    single_proc, single, single_sizes = one_process
    multi_proc, multi, sizes = run_accelerate(4, tmp_path / "four", EXAMPLE, four(data))

    per_update = list(zip(*sizes))
    assert len(per_update) == len(single_sizes[0]) == 13 + 12
    assert all(sum(s) == 16 for s in per_update) and set(single_sizes[0]) == {16}
    assert sum(len(set(s)) > 1 for s in per_update) > 20  # uneven in (nearly) every update
    assert min(min(s) for s in per_update) == 1  # a process at 1 sample (BatchNorm's hardest case)
    changes = sum(a != b for a, b in zip(per_update, per_update[1:]))
    assert changes >= 8, changes  # a new split every 2 updates (the first ones are fixed by the lag)

    diff = max_relative_difference(multi, single)
    print(f"accelerate: 4 processes vs 1 process: max relative difference {diff:.2e}")
    assert diff <= 1e-10
    score = r"test set: mean loss [0-9.]+, accuracy [0-9.]+%"
    scores = re.findall(score, multi_proc.stdout)
    assert len(scores) == 2 and re.findall(score, single_proc.stdout)[-1] == scores[-1], scores


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_the_accelerate_port_under_accelerate_launch_equals_one_process(tmp_path, data, one_process):
    """Launched as docs/accelerate.md says Accelerate users launch on CPUs: ``accelerate launch
    --multi_gpu --num_processes 4 ... --cpu`` (``--cpu`` of the launcher would start one process)."""
    port = free_ports(1)[0]
    launch = [os.path.join(VENV_BIN, "accelerate"), "launch", "--multi_gpu", "--num_processes", "4"]
    launch += ["--num_machines", "1", "--main_process_port", str(port), "--mixed_precision", "no"]
    launch += ["--dynamo_backend", "no"]
    _, multi, sizes = run_accelerate(4, tmp_path / "launched", EXAMPLE, four(data), launcher=launch)
    assert len(sizes) == 4 and min(min(s) for s in zip(*sizes)) == 1  # four processes of one job, uneven
    assert max_relative_difference(multi, one_process[1]) <= 1e-10


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
@pytest.mark.parametrize("without", ["weighting", "exact"])
def test_without_the_mechanism_the_accelerate_port_is_not_exact(without, tmp_path, data, one_process):
    """Accelerate's own Accelerator (its DDP averages the processes' gradients, whatever their
    batches), or the model without ``bno.exact`` (per-process dropout masks and BatchNorm statistics)."""
    _, single, _ = one_process
    _, multi, sizes = run_accelerate(4, tmp_path / without, EXAMPLE, four(data), without=without)
    assert all(sum(s) == 16 for s in zip(*sizes))  # the same uneven global batches
    diff = max_relative_difference(multi, single)
    print(f"accelerate without {without}: 4 processes vs 1 process: max relative difference {diff:.2e}")
    assert diff > 1e-6


REFUSALS = "tests/support/mpi_scripts/accelerate_refusals.py"
WRAP = 'python=$1; shift; "$python" "$@"; echo "process $RANK exit $?"'  # each process's exit, then 0


@pytest.mark.mpi
@pytest.mark.parametrize(
    "case,words",
    [
        ("accumulate", "gradient_accumulation_steps=2: bno.accelerate does not accumulate gradients"),
        ("apart", "bno.accelerate.Accelerator prepares a model for training together with the balancer's loader"),
        ("comm-hook", "DistributedDataParallelKwargs(comm_hook='fp16'): bno.accelerate's weighting hook owns"),
    ],
)
def test_what_accelerate_cannot_do_exactly_is_refused_in_one_line(case, words):
    proc = torchrun(2, ["--no-python", "sh", "-c", WRAP, "sh", *python_cmd(REFUSALS, case)], timeout=180)
    text = proc.stdout + proc.stderr
    assert sorted(re.findall(r"process (\d) exit (\d+)", proc.stdout)) == [("0", "2"), ("1", "2")], text[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "bno-hvd: error:" in line]
    assert len(errors) == 1 and words in errors[0], text[-3000:]
    assert "Traceback" not in text and "was not refused" not in text, text[-3000:]
