"""Fixtures of the whole suite; helpers live in tests/support/ (imported as ``support.*``)."""

import gzip
import os
import shutil
import sys
import tempfile

import pytest
from hypothesis.configuration import set_hypothesis_home_dir
from support.jobs import FASHION_DIR
from support.tiers import (  # noqa: F401
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_runtest_call,
    pytest_runtest_logreport,
    pytest_runtest_setup,
    pytest_runtest_teardown,
    pytest_sessionfinish,
)

pytest_plugins = ["pytester"]  # test_layout.py runs a small session to see that the tiers hold

# Hypothesis keeps its caches (and an example database, which the fuzz tests turn off) in
# .hypothesis/ of the working directory: keep them out of the checkout.
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "bno-hvd-hypothesis"))


@pytest.fixture(scope="session")
def fashion_available():
    if not os.path.isdir(FASHION_DIR):
        pytest.skip(f"{FASHION_DIR} missing: apt-get install dataset-fashion-mnist (launch/setup does)")
    return FASHION_DIR


@pytest.fixture(scope="session")
def fashion_dir(fashion_available, tmp_path_factory):
    """``--data-dir`` of the runs that train on Fashion-MNIST: its real IDX files, decompressed once
    per session. Every rank then reads the same bytes without gunzipping 26 MB first (0.3 CPU-s
    a rank); reading the gzipped files themselves is tests/data/test_data.py's."""
    where = tmp_path_factory.mktemp("fashion-mnist")
    for name in sorted(os.listdir(fashion_available)):
        if name.endswith("-ubyte.gz"):
            with gzip.open(os.path.join(fashion_available, name)) as src, open(where / name[:-3], "wb") as out:
                shutil.copyfileobj(src, out)
    return str(where)


@pytest.fixture(scope="module")
def fixture_modules(tmp_path_factory):
    """The user model modules --model may name (``bno_fuzz_models:ok``), importable here and in subprocesses."""
    from support import fuzz_trees as ft

    where = tmp_path_factory.mktemp("fuzz_modules")
    (where / f"{ft.FIXTURE_MODULE}.py").write_text(ft.FIXTURE_SOURCE)
    (where / f"{ft.BROKEN_MODULE}.py").write_text(ft.BROKEN_SOURCE)
    sys.path.insert(0, str(where))
    yield where
    sys.path.remove(str(where))


# One real 2-rank experiment (EMULATED speeds 1 and 0.5, equal and balanced, 20 updates) whose
# outputs test_experiment.py, test_stragglers.py and test_fuzz_report.py read (copies, never the
# original). They are marked alone: launch/test runs them in its one-process phase, so it runs once.
TINY_EXPERIMENT = [
    "--models",
    "cnn",
    "--strategies",
    "equal,balanced",
    "--updates",
    "20",
    "--average-every",
    "5",
    "--dataset",
    "synthetic",
    "--base-batch-size",
    "16",
    "--rebalance-every",
    "5",
    "--eval-every",
    "10",
    "--target-accuracy",
    "0.2",
    "--emulate-speed",
    "1,0.5",
    "--emulate-rate",
    "200",  # 80 / 160 ms per update: far above the CNN's own compute, also on a busy machine
    "--latency-interval",
    "1",
]


@pytest.fixture(scope="session")
def tiny_experiment(tmp_path_factory):
    """``(out, proc)`` of ``bno-hvd experiment TINY_EXPERIMENT --out out --tensorboard out/tb``."""
    from support.jobs import assert_ok, bno_cmd, horovodrun

    out = tmp_path_factory.mktemp("experiment")
    args = [*TINY_EXPERIMENT, "--out", str(out), "--tensorboard", str(out / "tb")]
    proc = horovodrun(2, bno_cmd("experiment", *args), timeout=400)
    assert_ok(proc)
    return out, proc
