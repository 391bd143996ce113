"""The GPU check's first two parts and its packing step (:mod:`bno_hvd.lab.gpucheck`).

- ``--probe`` (part ``environment``): the GPU, its memory, the driver, torch and CUDA, the modules
  the other parts import (missing ones are listed, not fatal: ``--install`` may bring them), and
  whether CUDA MPS can be tried; fails only where torch sees no GPU.
- ``--install`` (part ``install``): the pure-Python dependencies this python lacks, from the wheels
  carried in ``build/gpu-check-wheels`` (no index), then the project itself, editable and without
  dependencies (where pip cannot build that, a ``.pth`` file naming the tree, which is what an
  editable install amounts to); fails where a module the parts need is still missing.
- ``--pack`` (here, with a registry, before the GPU run): downloads those wheels into
  ``build/gpu-check-wheels``, an ignored folder that the run carries.

Each writes what it found to ``numbers.json`` in ``$GPU_CHECK_PART_DIR`` (the report's "measured").
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys

NEEDED = ("torch", "torchvision", "click", "psutil", "numpy", "tqdm", "pytest", "hypothesis")
OPTIONAL = ("matplotlib", "mpi4py", "pynvml")  # bench's figures; MPI launches; NVML memory


def missing(names) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is None]


def save(numbers: dict) -> None:
    folder = os.environ.get("GPU_CHECK_PART_DIR")
    if folder:
        with open(os.path.join(folder, "numbers.json"), "w") as fh:
            json.dump(numbers, fh, indent=1)
    print(json.dumps(numbers, indent=1))


def probe() -> int:
    import torch

    numbers = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda or "none"}
    numbers["cpus"] = os.cpu_count()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        numbers.update(gpu=props.name, gpus=torch.cuda.device_count(), sms=props.multi_processor_count)
        numbers["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
        numbers["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "?"
    numbers["mps_control"] = bool(shutil.which("nvidia-cuda-mps-control"))
    numbers["missing"] = ",".join(missing(NEEDED)) or "none"
    numbers["missing_optional"] = ",".join(missing(OPTIONAL)) or "none"
    save(numbers)
    return 0 if torch.cuda.is_available() else 1


def pip(*args, cwd: str) -> subprocess.CompletedProcess:
    # PEP 668: a distribution's system python refuses pip without this; nothing here leaves the tree
    env = {**os.environ, "PIP_BREAK_SYSTEM_PACKAGES": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, env=env, capture_output=True, text=True)


def install(root: str, wheels: str, deps) -> int:
    numbers, lacking = {}, missing(deps)
    folder = os.path.join(root, wheels)
    if lacking and os.path.isdir(folder):
        got = pip("install", "-q", "--no-index", "--find-links", folder, *lacking, cwd=root)
        print(got.stdout + got.stderr)
        numbers["from_wheels"] = ",".join(lacking) if got.returncode == 0 else f"failed: {','.join(lacking)}"
    done = pip("install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-e", root, cwd=root)
    print(done.stdout + done.stderr)
    numbers["pip_install"] = "ok" if done.returncode == 0 else f"exit {done.returncode}"
    if done.returncode != 0:  # (an old setuptools without wheel cannot build an editable install)
        numbers["path_entry"] = path_entry(root)
    numbers["still_missing"] = ",".join(missing(NEEDED)) or "none"
    save(numbers)
    # the parts import the tree itself (PYTHONPATH); this makes it importable from anywhere too
    installed = done.returncode == 0 or numbers["path_entry"].endswith(".pth")
    return 0 if installed and numbers["still_missing"] == "none" else 1


def path_entry(root: str) -> str:
    """What an editable install amounts to: a ``.pth`` file naming ``root`` in this python's
    site-packages; its path, or why not."""
    import site
    import sysconfig

    where = sysconfig.get_paths()["purelib"]
    path = os.path.join(where, "bno-hvd-gpu-check.pth")
    try:
        with open(path, "w") as fh:
            fh.write(root + "\n")
    except OSError as err:
        return f"not written: {err}"
    site.addsitedir(where)
    return path


def pack(root: str, wheels: str, deps) -> int:
    folder = os.path.join(root, wheels)
    os.makedirs(folder, exist_ok=True)
    got = pip("download", "-q", "--no-deps", "--only-binary=:all:", "-d", folder, *deps, cwd=root)
    print(got.stdout + got.stderr, end="")
    if got.returncode != 0:
        return 1
    print(f"gpu-check: {folder}: {', '.join(sorted(os.listdir(folder)))}; carry {wheels} to the GPU machine")
    return 0


def main(args, root: str, wheels: str, deps) -> int:
    if args.probe:
        return probe()
    if args.install:
        return install(root, wheels, deps)
    return pack(root, wheels, deps)
