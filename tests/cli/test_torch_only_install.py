"""Installable without Horovod: a fresh venv with torch and this project (no Horovod, no mpi4py, no
torchvision) trains with the torch engine under torchrun. (What a Horovod command says there is
tests/cli/test_pip_install.py's part.)

The venv takes the cheapest real torch: ``pip install torch==2.13.0`` (where pip is configured
with a local CPU build, seconds; else the registry's), the project with ``--no-deps``, then the
few packages the torch engine's path imports (click, psutil, numpy, tqdm)."""

import os
import subprocess
import sys

import pytest
from support.jobs import FASHION_DIR, ROOT, TORCHRUN_EXIT_HANG

TORCH = "torch==2.13.0"
DEPS = ["click", "psutil", "numpy", "tqdm"]


def pip(venv, *args):
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q", "install", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def in_venv(venv, *args, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1")
    return subprocess.run(list(args), capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


@pytest.mark.slow
@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_a_venv_with_torch_alone_runs_the_torch_engine(tmp_path, fashion_available):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip(venv, TORCH)
    pip(venv, "--no-deps", ROOT)
    pip(venv, *DEPS)
    listed = in_venv(venv, "python", "-m", "pip", "list", cwd=tmp_path).stdout.lower()
    assert "horovod" not in listed and "mpi4py" not in listed and "torchvision" not in listed

    out = tmp_path / "run"
    args = ["--engine", "torch", "--updates", "8", "--no-progress", "--latency-interval", "0"]
    proc = in_venv(
        venv,
        *["torchrun", "--standalone", "--nproc-per-node", "2", "--no-python", "bno-hvd", "train", *args],
        *["--data-dir", FASHION_DIR, "--log-dir", str(out)],
        cwd=tmp_path,  # not the checkout: the installed package runs
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "test accuracy:" in proc.stdout and "after 8 updates" in proc.stdout
    assert (out / "result.json").is_file()
