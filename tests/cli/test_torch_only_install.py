"""Installable without Horovod: a fresh venv with torch and this project (no Horovod, no mpi4py, no
torchvision) trains with the torch engine under torchrun, and each framework adapter
(``bno.lightning``, ``bno.accelerate``, ``bno.hf``), whose extra is not installed, ends the script
with one line that names it. (What a Horovod command says there is tests/cli/test_pip_install.py's part.)

The venv (made without pip: this interpreter's pip installs into it, ``--python``) gets torch as
test_pip_install.py gives it PyTorch: the installed distribution and what it requires,
hard-linked with their metadata (what pip would unpack from the same wheel; unpacking a CPU wheel
of 190 MB was most of this test's time). pip then builds the project and installs it with the
few packages the torch engine's path imports (click, psutil, numpy, tqdm; none requires another),
with ``--no-deps``: nothing else gets in."""

import glob
import os
import subprocess
import sys

import pytest
from support.jobs import FASHION_DIR, ROOT
from support.run_port import write_fashion_subset
from test_pip_install import link_pytorch

DEPS = ["click", "psutil", "numpy", "tqdm"]


def in_venv(venv, *args, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1")
    return subprocess.run(list(args), capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


@pytest.mark.slow
@pytest.mark.mpi
def test_a_venv_with_torch_alone_runs_the_torch_engine(tmp_path, fashion_available):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    link_pytorch(glob.glob(str(venv / "lib" / "python3*" / "site-packages"))[0], names=["torch"])
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]  # this pip, for the venv
    installed = subprocess.run([*pip, "install", "-q", "--no-deps", ROOT, *DEPS], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    listed = in_venv(venv, *pip, "list", cwd=tmp_path).stdout.lower()
    assert "horovod" not in listed and "mpi4py" not in listed and "torchvision" not in listed

    out = tmp_path / "run"
    args = ["--engine", "torch", "--updates", "8", "--no-progress", "--latency-interval", "0"]
    proc = in_venv(
        venv,
        *["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"],  # = torchrun
        *["--no-python", "bno-hvd", "train", *args],
        *["--data-dir", write_fashion_subset(tmp_path / "data", FASHION_DIR, 2048, 512), "--log-dir", str(out)],
        cwd=tmp_path,  # not the checkout: the installed package runs
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "test accuracy:" in proc.stdout and "after 8 updates" in proc.stdout
    assert (out / "result.json").is_file()

    # the frameworks' extras are not installed here: each adapter says in one line what to install
    for name, extra in (("lightning", "lightning"), ("accelerate", "accelerate"), ("hf", "hf")):
        for rank in ("0", "1"):  # every process exits 2; rank 0 alone prints the line
            code = f"import os; os.environ['RANK'] = '{rank}'; import bno_hvd; bno_hvd.{name}.X"
            proc = in_venv(venv, "python", "-c", code, cwd=tmp_path)
            lines = proc.stderr.splitlines()
            assert proc.returncode == 2, proc.stderr[-2000:]
            if rank == "0":
                assert len(lines) == 1 and f"pip install 'bno-hvd[{extra}]'" in lines[0], proc.stderr[-2000:]
            else:
                assert not lines, proc.stderr[-2000:]
