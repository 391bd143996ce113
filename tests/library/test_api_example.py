"""The public-API example (docs/porting.md, "The explicit API") runs as written under horovodrun (2 ranks)."""

import re

import pytest
from support.jobs import assert_ok, horovodrun, python_cmd

pytestmark = pytest.mark.mpi


def test_custom_loop_example_runs(fashion_available):
    proc = horovodrun(2, python_cmd("examples/custom_loop.py"), timeout=300)
    assert_ok(proc)
    out = re.sub(r"\[\d+,\d+\]<stdout>:", "", proc.stdout)  # mpirun's per-rank output tags
    m = re.search(r"final batch sizes \[(\d+), (\d+)\] loss ([0-9.]+)", out)
    assert m, proc.stdout[-2000:]
    assert int(m.group(1)) + int(m.group(2)) == 64  # balanced keeps the global batch N*B
    assert float(m.group(3)) < 2.0  # trained below the initial ~2.30


def test_text_loop_example_runs():
    proc = horovodrun(2, python_cmd("examples/text_loop.py"), timeout=300)
    assert_ok(proc)
    out = re.sub(r"\[\d+,\d+\]<stdout>:", "", proc.stdout)
    m = re.search(r"sequences per rank \[(\d+), (\d+)\], (\d+) tokens, loss ([0-9.]+)", out)
    assert m, proc.stdout[-2000:]
    assert int(m.group(3)) >= 2048  # the global batch is fixed in tokens
    assert float(m.group(4)) < 7.0  # trained below the initial ~7.6 (log 2048)
