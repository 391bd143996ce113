"""The public-API example (docs/porting.md, "The explicit API") runs as written under horovodrun (2 ranks);
the text example's run is tests/library/test_text_examples.py."""

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
