"""The Lightning port (``examples/lightning_mnist.py``, docs/lightning.md): marked as the DDP and
Horovod examples are (``tests/support/port_twin.py``), the plain twin differs in the marked lines
alone, keeps every lint rule, and both scripts train when Lightning starts their ranks itself."""

import csv
import difflib
import re
import subprocess
import sys

import pytest
from support.jobs import FASHION_DIR, ROOT, assert_ok, mpi_env
from support.port_twin import LIGHTNING_EXAMPLE as EXAMPLE
from support.port_twin import example_source, lint_failures, plain_twin, port_diff, port_markers
from support.run_port import write_fashion_subset

NAME = "examples/lightning_mnist.py"


def test_the_lightning_twin_differs_from_the_example_in_at_most_5_marked_lines():
    source = example_source(EXAMPLE)
    marks = port_markers(source)
    example, twin = source.splitlines(), plain_twin(source).splitlines()
    assert 1 <= len(marks) <= 5, len(marks)
    compile("\n".join(twin), "twin", "exec")
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, twin, example, autojunk=False).get_opcodes():
        if tag != "equal":
            assert all(j in marks for j in range(j1, j2)), example[j1:j2]  # an unmarked line differs
            was = [marks[j] for j in range(j1, j2) if marks[j] is not None]
            assert [line.strip() for line in twin[i1:i2]] == was, (twin[i1:i2], was)
    # the LightningModule is untouched: every marked line is in main() or the options
    module = source[source.index("class Net(") : source.index("def main(")]
    assert "# bno-hvd" not in module
    code = [line for line in twin if not line.lstrip().startswith("#")]
    assert not any(re.search(r"\bbno\.", line) for line in code)
    assert any(line.strip() == 'strategy = "ddp"' for line in twin)
    assert any("DataLoader(train_set, batch_size=self.batch_size, shuffle=True)" in line for line in twin)


def test_docs_show_the_lightning_port_as_it_is():
    with open(f"{ROOT}/docs/lightning.md") as fh:
        page = fh.read()
    diff = port_diff(example_source(EXAMPLE), name=NAME, plain="Lightning")
    assert diff in page
    assert f"The diff from the plain script changes {len(port_markers(example_source(EXAMPLE)))} lines" in page
    assert "python examples/lightning_mnist.py" in page and "torchrun --nproc-per-node 4" in page


@pytest.mark.slow
def test_the_lightning_twin_and_the_example_keep_every_lint_and_format_rule():
    failures = lint_failures(EXAMPLE)
    assert not failures, failures


@pytest.mark.slow
@pytest.mark.parametrize("which", ["plain twin", "port"])
def test_the_example_and_its_plain_twin_train_a_few_updates(which, tmp_path, fashion_available):
    data = write_fashion_subset(tmp_path / "data", FASHION_DIR, train=256, test=100)
    script = tmp_path / "plain_lightning_mnist.py"
    script.write_text(plain_twin(example_source(EXAMPLE)))
    script = script if which == "plain twin" else EXAMPLE
    logs = tmp_path / "logs"
    args = ["--data-dir", data, "--batch-size", "8", "--max-steps", "4", "--log-dir", str(logs)]
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=mpi_env({"OMP_NUM_THREADS": "1"}),
        cwd=tmp_path,
    )
    assert_ok(proc)
    assert "Traceback" not in proc.stderr and "test_accuracy" in proc.stdout
    [metrics] = list(logs.glob("lightning_logs/version_*/metrics.csv"))
    losses = [float(r["train_loss"]) for r in csv.DictReader(metrics.open()) if r.get("train_loss")]
    assert len(losses) == 4 and all(0 < loss < 10 for loss in losses)
    assert ("bno/batch_size/rank3" in metrics.read_text()) == (which == "port")
