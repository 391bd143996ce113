"""The documentation site builds strictly: ``sphinx-build -W --keep-going -n -b html docs OUT``
in this process (no subprocess, no MPI job). Any warning fails the test and is printed: a page
that does not parse, a page in no toctree, a relative link or ``page.md#heading`` that leads
nowhere, an unresolved cross-reference in the API reference (``nitpicky``), a docstring autodoc
cannot render."""

import io
import os
import re

import mpi4py
import pytest
from sphinx.application import Sphinx
from support.jobs import ROOT

import bno_hvd

DOCS = os.path.join(ROOT, "docs")
# myst-parser still uses Sphinx APIs that Sphinx 11 removes: its notices, not ours
pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning", "ignore::DeprecationWarning")


def build(out_dir, builder="html"):
    """Build the site into ``out_dir``; returns the warnings Sphinx wrote."""
    warnings = io.StringIO()
    rc = (mpi4py.rc.initialize, mpi4py.rc.finalize)  # docs/conf.py turns MPI start-up off for autodoc
    try:
        app = Sphinx(
            srcdir=DOCS,
            confdir=DOCS,
            outdir=str(out_dir / builder),
            doctreedir=str(out_dir / "doctrees"),
            buildername=builder,
            status=None,
            warning=warnings,
            freshenv=True,
            keep_going=True,
        )
        app.build(force_all=True)
    finally:
        mpi4py.rc.initialize, mpi4py.rc.finalize = rc
    return re.sub(r"\x1b\[[0-9;]*m", "", warnings.getvalue())  # without the terminal's colours


def test_docs_build_without_a_warning(tmp_path):
    warnings = build(tmp_path)
    assert warnings == "", (
        "the docs build warned (run sphinx-build -W --keep-going -n -b html docs /tmp/html):\n" + warnings
    )
    html = tmp_path / "html"
    api = (html / "api.html").read_text()
    exported = set(bno_hvd.__all__) - {"__version__"}
    documented = set(re.findall(r'id="bno_hvd\.([A-Za-z_]+)"', api))
    # every export has its entry (a new export without docs fails here), and the page documents no
    # top-level name the package does not export
    assert exported - documented == set(), f"docs/api.md does not document {sorted(exported - documented)}"
    assert documented - exported == set(), (
        f"docs/api.md documents names bno_hvd does not export: {sorted(documented - exported)}"
    )
    cli = (html / "cli.html").read_text()
    assert 'id="bno-hvd-train"' in cli and "--strategy" in cli
    pages = {p[:-3] for p in os.listdir(DOCS) if p.endswith(".md")}
    assert {p for p in pages if not (html / f"{p}.html").exists()} == set()
