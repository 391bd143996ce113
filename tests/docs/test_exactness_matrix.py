"""The exactness matrix (``tests/support/exactness_matrix.py``, shown in docs/exactness.md) is whole
and true: every path x every mechanism has a cell; every test a cell names exists (its file, its
function, its parameter ids); every refusal's line is what its test expects; the page shows the
table as the list makes it (``launch/update-docs``). Pure: no subprocess."""

import os
import re

import pytest
from support.exactness_matrix import CELLS, MECHANISMS, PATHS, Refused, matrix_markdown
from support.jobs import ROOT


def test_every_path_has_a_cell_for_every_mechanism():
    assert set(CELLS) == {(path, mechanism) for path in PATHS for mechanism in MECHANISMS}


@pytest.mark.parametrize("key", sorted(CELLS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_the_test_a_cell_names_exists(key):
    cell = CELLS[key]
    path, _, rest = cell.node.partition("::")
    function, _, ids = rest.partition("[")
    with open(os.path.join(ROOT, path)) as fh:
        source = fh.read()
    assert re.search(rf"^def {re.escape(function)}\(", source, re.M), f"{path} has no {function}"
    for part in filter(None, re.split(r"[-\]]", ids)):  # each parameter id appears in the file
        assert part == "*" or part in source, f"{cell.node}: {part!r} is no parameter of the test"
    if isinstance(cell, Refused):  # the refusal's test expects exactly this line
        assert cell.line in source, f"{path} does not expect the refusal {cell.line!r}"


def test_the_page_shows_the_matrix_as_it_is():
    with open(os.path.join(ROOT, "docs", "exactness.md")) as fh:
        page = fh.read()
    table = page.split("<!-- exactness-matrix:start -->\n")[1].split("<!-- exactness-matrix:end -->")[0]
    assert table == matrix_markdown(), "stale: run launch/update-docs"
