"""Shared helpers: start real mpirun/horovodrun jobs as subprocesses."""

import os
import subprocess
import sys
import tempfile

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

from bno_hvd import launching

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Hypothesis keeps its caches (and an example database, which the fuzz tests turn off) in
# .hypothesis/ of the working directory: keep them out of the checkout.
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "bno-hvd-hypothesis"))
VENV_BIN = os.path.dirname(sys.executable)
FASHION_DIR = "/usr/share/datasets/fashion-mnist"


def mpi_env(extra=None):
    """This environment with the project's MPI settings, the venv first on PATH, this checkout first on PYTHONPATH."""
    env = launching.mpi_env()
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def mpirun(np_, args, *, timeout=300, env=None, cwd=None):
    """Run ``args`` (a list) on ``np_`` ranks with plain mpirun; returns CompletedProcess."""
    return launching.mpirun(np_, args, timeout=timeout, env=mpi_env(env), cwd=cwd or ROOT)


def horovodrun(np_, args, *, timeout=300, env=None, hostfile=None):
    cmd = [os.path.join(VENV_BIN, "horovodrun"), "-np", str(np_), "--mpi"]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    else:
        cmd += ["-H", f"localhost:{np_}"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout, env=mpi_env(env), cwd=ROOT)


def python_cmd(*args):
    return [sys.executable, *args]


def bno_cmd(*args):
    return [sys.executable, "-m", "bno_hvd", *args]


def run_cli(*args, timeout=120, env=None):
    """``bno-hvd ARGS`` in a plain (non-MPI) subprocess."""
    return subprocess.run(bno_cmd(*args), capture_output=True, text=True, timeout=timeout, env=mpi_env(env), cwd=ROOT)


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png_drawing(path, *, colours=(), min_bytes=15_000):
    """``path`` is a PNG with a real drawing: not tiny, many colours, and each RGB in ``colours`` used."""
    import matplotlib.image
    import numpy as np

    data = open(path, "rb").read()
    assert data[:8] == PNG_MAGIC and len(data) > min_bytes, (path, len(data))
    pixels = matplotlib.image.imread(path)[..., :3].reshape(-1, 3)
    assert len(np.unique(pixels.round(2), axis=0)) > 20, path
    for rgb in colours:
        near = np.abs(pixels - np.array(rgb)).max(axis=1) < 0.02
        assert near.sum() > 200, (path, rgb, int(near.sum()))


def max_relative_difference(a, b, floor=1e-12):
    """Largest |a - b| over the largest |b|, over every tensor of two state dicts."""
    return max(((a[k] - b[k]).abs().max() / (b[k].abs().max() + floor)).item() for k in b)


def assert_ok(proc):
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-4000:]}"
    )


@pytest.fixture(scope="session")
def fashion_available():
    if not os.path.isdir(FASHION_DIR):
        pytest.skip(f"{FASHION_DIR} missing: apt-get install dataset-fashion-mnist (launch/setup does)")
    return FASHION_DIR


@pytest.fixture(scope="module")
def fixture_modules(tmp_path_factory):
    """The user model modules --model may name (``bno_fuzz_models:ok``), importable here and in subprocesses."""
    import fuzz_trees as ft

    where = tmp_path_factory.mktemp("fuzz_modules")
    (where / f"{ft.FIXTURE_MODULE}.py").write_text(ft.FIXTURE_SOURCE)
    (where / f"{ft.BROKEN_MODULE}.py").write_text(ft.BROKEN_SOURCE)
    sys.path.insert(0, str(where))
    yield where
    sys.path.remove(str(where))
