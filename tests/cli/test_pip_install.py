"""The pip path: ``pip install .`` into a fresh virtual environment that has PyTorch, then the
project's Horovod wheel as the ``horovod`` extra, and a real 2-rank training from that venv.

The fresh venv gets PyTorch the way an environment "with PyTorch" has it: the installed
distributions of torch and torchvision and everything they require, hard-linked file by file
from this interpreter's environment with their metadata (what pip would unpack from the same
wheels; re-installing 4.6 GB of CUDA wheels would cost minutes). pip itself then builds the
project from a copy of this checkout and installs the project's own dependencies (mpi4py,
click, matplotlib, tensorboard, tokenizers, ...) and Horovod's from the package index. No
PYTHONPATH: the runs import what pip installed.
"""

import glob
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from packaging.requirements import Requirement
from support.jobs import ROOT, VENV_BIN

pytestmark = [pytest.mark.slow, pytest.mark.mpi]


def horovod_wheel():
    """The wheel launch/setup built for this torch and Python, or skip."""
    cache = os.environ.get("BNO_CACHE", os.path.expanduser("~/.cache/bno-hvd"))
    torch_version = torch.__version__.split("+")[0]
    pattern = f"{cache}/wheels/torch-{torch_version}-py{sys.version_info.major}{sys.version_info.minor}*/horovod-*.whl"
    found = sorted(glob.glob(pattern))
    if not found:
        pytest.skip(f"no Horovod wheel matches {pattern} (launch/setup builds it there)")
    return found[0]


def with_requirements(names):
    """The installed distributions ``names`` and everything they require, by normalised name."""
    found, todo, done = {}, [(n, frozenset()) for n in names], set()
    while todo:
        name, extras = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if (key, extras) in done:
            continue
        done.add((key, extras))
        try:
            found[key] = dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras or {""}):
                todo.append((req.name, frozenset(req.extras)))
    return found


def link_pytorch(site_packages, names=("torch", "torchvision")):
    """``names`` and their requirements into ``site_packages`` (hard links; a copy across devices)."""
    for key, dist in with_requirements(names).items():
        if key in ("pip", "setuptools"):  # the fresh venv has its own
            continue
        for path in dist.files:
            source, target = dist.locate_file(path), os.path.join(site_packages, path)
            if path.parts[0] == ".." or not os.path.exists(source):  # console scripts point at the other venv
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)


def run(args, env, cwd, timeout=600):
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_pip_install_into_a_fresh_venv_then_horovod_then_a_2_rank_run(tmp_path, fashion_available):
    wheel = horovod_wheel()
    venv, src = tmp_path / "venv", tmp_path / "bno-hvd"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    link_pytorch(glob.glob(str(venv / "lib" / "python3*" / "site-packages"))[0])
    skip = (".git", ".venv", "runs", "results", "build", "*.egg-info", "__pycache__", ".hypothesis")
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*skip), symlinks=True)
    bin_dir = str(venv / "bin")
    path = [p for p in os.environ["PATH"].split(os.pathsep) if p != VENV_BIN]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=os.pathsep.join([bin_dir, *path]), OMP_NUM_THREADS="1")
    # this pip, run by the venv's interpreter (--python): it installs into the venv as the venv's own would
    pip = [sys.executable, "-m", "pip", "--python", f"{bin_dir}/python", "install", "-q", "--no-compile"]

    # 1. the project alone: everything but Horovod, and a one-line error naming the extra
    ok(run([*pip, str(src)], env, tmp_path))
    where = ok(run([f"{bin_dir}/python", "-c", "import bno_hvd; print(bno_hvd.__file__)"], env, tmp_path))
    assert where.stdout.strip().startswith(str(venv)), where.stdout
    assert "Usage: bno-hvd" in ok(run([f"{bin_dir}/bno-hvd", "--help"], env, tmp_path)).stdout
    train = [f"{bin_dir}/bno-hvd", "train", "--updates", "60", "--base-batch-size", "16", "--no-progress"]
    proc = run(train, env, tmp_path, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "bno-hvd: error: Horovod is not installed: install bno-hvd[horovod] (Horovod built with PyTorch and MPI)"
    ], proc.stderr[-3000:]

    # 2. the horovod extra as the error says (the installed project, Horovod from its wheel), then training
    ok(run([*pip, "bno-hvd[horovod]", wheel], env, tmp_path))
    hosts = ["-np", "2", "-H", "localhost:2", "--mpi"]
    proc = ok(run([f"{bin_dir}/horovodrun", *hosts, *train, "--log-dir", str(tmp_path / "log")], env, tmp_path))
    accuracy = re.search(r"test accuracy: ([0-9.]+) \((\d+)/10000\)", proc.stdout)
    assert accuracy and float(accuracy.group(1)) > 0.3, proc.stdout[-3000:]  # chance is 0.1
    assert (tmp_path / "log" / "result.json").exists()
