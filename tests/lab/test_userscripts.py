"""A user's script timed from outside (benchmarks/dropin_real.py): the arithmetic of
bno_hvd/lab/userscripts.py, and bno_hvd/lab/stamps.py running a real script - one that trains with
torch's optimizer and ends as it likes (its last line, sys.exit(0), or a failure, which it keeps)."""

import json
import math
import os
import subprocess
import sys

import pytest
from support.jobs import ROOT

from bno_hvd.lab.userscripts import (
    PER_RANK,
    PLAIN,
    SCRIPTS,
    TWIN_OF,
    format_rows,
    stamps_cpu,
    stamps_rate,
    summarize,
    variants,
)


def test_the_rate_counts_the_updates_after_the_warm_up():
    steps = [0.0, 1.0, 2.0, 2.5, 3.0, 3.5]  # updates 0..5 ended at these seconds
    assert stamps_rate(steps, 128, 2) == pytest.approx(4 * 128 / 2.5)  # updates 2..5, from the end of update 1
    assert math.isnan(stamps_rate(steps[:2], 128, 2)) and math.isnan(stamps_rate(steps, 128, 0))
    assert math.isnan(stamps_rate([1.0, 1.0, 1.0], 128, 1))  # no time passed: no rate
    assert stamps_cpu([0.5, 1.0, 1.25, 1.5], 2) == pytest.approx(250.0)  # ms per update over updates 2..3
    assert math.isnan(stamps_cpu([0.5, 1.0], 2))


def test_each_kind_runs_its_plain_twin_and_its_port_per_strategy():
    runs = variants("ddp", ["balanced", "equal"])
    assert [(v.name, v.script, v.launcher) for v in runs] == [
        (PLAIN, "twin", "torchrun"),
        ("port:balanced", "examples/ddp_mnist.py", "torchrun"),
        ("port:equal", "examples/ddp_mnist.py", "torchrun"),
    ]
    train = variants("train", ["balanced"])
    assert (train[1].name, train[1].script, train[1].launcher) == ("train:balanced", "bno_hvd/__main__.py", "mpirun")
    assert TWIN_OF["train"] == "horovod"  # bno-hvd train meets the plain Horovod script on its model
    trainer = variants("trainer", ["balanced"])
    assert [v.args for v in trainer] == [("--cpu",), ("--cpu", "--strategy", "balanced")]
    local = variants("lightning", ["balanced  --local-batchnorm"])[1]  # more of the port's flags after a space
    assert (local.name, local.args) == (
        "port:balanced --local-batchnorm",
        ("--strategy", "balanced", "--local-batchnorm"),
    )
    # its runs keep the example's own --batch-size, which the rate counts as sequences per rank
    source = open(os.path.join(ROOT, SCRIPTS["trainer"][0])).read()
    assert f'"--batch-size", type=int, default={PER_RANK["trainer"]},' in source


def test_the_table_pairs_each_round_with_the_plain_run():
    table = summarize({PLAIN: [100.0, 200.0, 100.0], "port:balanced": [200.0, 300.0, 150.0]})
    assert table["port:balanced"]["median"] == pytest.approx(1.5)  # 2.0, 1.5, 1.5 per round
    rows = format_rows("outside-10ms", "horovod", table)
    assert rows[0] == "| outside-10ms | horovod | plain | 100 | 1 |"
    assert rows[1].startswith("| outside-10ms | horovod | port:balanced | 200 | **1.50** [")


SCRIPT = """
import sys, torch
w = torch.nn.Parameter(torch.zeros(2))
opt = torch.optim.SGD([w], lr=0.1)
for _ in range({steps}):
    opt.zero_grad(); (w - 1).pow(2).sum().backward(); opt.step()
print("args", sys.argv[1:])
{end}
"""


@pytest.mark.slow
@pytest.mark.parametrize("end, code", [("", 0), ("sys.exit(0)", 0), ("sys.exit(3)", 3)])
def test_stamps_time_every_step_of_a_script_that_ends_as_it_likes(tmp_path, end, code):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(steps=5, end=end))
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", RANK="0")
    cmd = [sys.executable, "-m", "bno_hvd.lab.stamps", str(tmp_path), str(script), "--flag", "x"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert "args ['--flag', 'x']" in proc.stdout
    if code:  # a failed script leaves no stamps, so its run counts as failed
        assert not (tmp_path / "done-0").exists() and not (tmp_path / "stamps-0.json").exists()
        return
    stamps = json.loads((tmp_path / "stamps-0.json").read_text())
    assert stamps["rank"] == 0 and len(stamps["steps"]) == 5 and stamps["steps"] == sorted(stamps["steps"])
    assert len(stamps["cpu"]) == 5 and stamps["cpu"] == sorted(stamps["cpu"]) and stamps["cpu"][0] > 0
    assert (tmp_path / "done-0").exists()
