"""REAL GPU heterogeneity on one GPU: ranks that share it with different shares of it.

Each local rank gets one entry of a spec (``gpu:100,gpu:40,gpu:40,gpu:15``, or ``gpu,cpu,cpu,cpu``):

- ``gpu:P``: the GPU under CUDA MPS, at most P% of its streaming multiprocessors
  (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``); needs an MPS daemon (:func:`start_mps`);
- ``gpu``: the GPU, time-sliced with the other ranks on it;
- ``cpu``: no GPU at all (``CUDA_VISIBLE_DEVICES`` empty): ``--device auto`` trains on the CPU.

Every GPU rank is told it is local rank 0, so that ``--device auto`` puts it on GPU 0 (one GPU
for all; bno-hvd otherwise starts one rank per GPU). The ranks sum their gradients over Gloo
(``--engine torch --collectives gloo``): NCCL takes one rank per GPU and CPU tensors not at all.

Usage (under torchrun, which sets ``LOCAL_RANK``)::

    ok, why = start_mps(MPS_FOLDER, sys.executable)
    torchrun --nproc-per-node 4 -m bno_hvd.lab.gpushares gpu:100,gpu:15,gpu:15,gpu:15 -- \\
        python -m bno_hvd bench --engine torch --collectives gloo ...   # (with mps_env(MPS_FOLDER))
    stop_mps(MPS_FOLDER)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from bno_hvd.common.errors import UsageError

MPS_FOLDER = "/tmp/bno-hvd-mps"  # short: the daemon's pipes are sockets, whose paths may not pass ~100 bytes
PROBE = (  # a CUDA client under MPS at half the SMs: its SM count (MPS reports the limited one)
    "import torch; x = torch.ones(1024, 1024, device='cuda'); y = (x @ x).sum().item(); "
    "print(torch.cuda.get_device_properties(0).multi_processor_count)"
)


def parse_spec(spec: str) -> list[tuple[str, int | None]]:
    """``[(kind, percent), ...]`` per local rank: kind ``gpu`` or ``cpu``; percent None where not set."""
    out = []
    for entry in spec.split(","):
        kind, _, pct = entry.strip().partition(":")
        if kind not in ("gpu", "cpu") or (kind == "cpu" and pct):
            raise UsageError(f"gpu shares: {entry!r}: write gpu, gpu:PERCENT or cpu per rank (e.g. gpu:100,gpu:15)")
        if pct and not (pct.isdigit() and 1 <= int(pct) <= 100):
            raise UsageError(f"gpu shares: {entry!r}: the percentage must be a whole number from 1 to 100")
        out.append((kind, int(pct) if pct else None))
    return out


def rank_env(spec: str, local_rank: int) -> dict[str, str]:
    """The environment that puts local rank ``local_rank`` where ``spec`` says (pure)."""
    entries = parse_spec(spec)
    if not 0 <= local_rank < len(entries):
        raise UsageError(f"gpu shares: {len(entries)} entries for local rank {local_rank}: give one per rank")
    kind, pct = entries[local_rank]
    if kind == "cpu":
        return {"CUDA_VISIBLE_DEVICES": ""}
    env = {"LOCAL_RANK": "0"}
    if pct is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
    return env


def describe(spec: str) -> str:
    """One line for a report: ``4 ranks on one GPU under MPS at 100,15,15,15% of its SMs``."""
    entries = parse_spec(spec)
    gpus = [p for k, p in entries if k == "gpu"]
    cpus = sum(k == "cpu" for k, _ in entries)
    if cpus:
        return f"{len(gpus)} rank(s) on the GPU beside {cpus} on the CPU"
    if all(p is not None for p in gpus):
        return f"{len(gpus)} ranks on one GPU under MPS at {','.join(map(str, gpus))}% of its SMs"
    return f"{len(gpus)} ranks time-sharing one GPU"


def mps_env(folder: str) -> dict[str, str]:
    """What a client (and the daemon) need to find this MPS daemon: its own pipe and log folders."""
    return {
        "CUDA_MPS_PIPE_DIRECTORY": os.path.join(folder, "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": os.path.join(folder, "log"),
    }


def start_mps(folder: str, python: str = sys.executable, timeout: float = 30) -> tuple[bool, str]:
    """Start an MPS daemon whose pipes live in ``folder`` and check that a CUDA client runs under
    it at 50% of the SMs; ``(True, SM count it saw)``, or ``(False, why)`` with the daemon stopped."""
    control = shutil.which("nvidia-cuda-mps-control")
    if not control:
        return False, "no nvidia-cuda-mps-control on PATH"
    env = {**os.environ, **mps_env(folder)}
    for path in mps_env(folder).values():
        os.makedirs(path, exist_ok=True)
    try:
        started = subprocess.run([control, "-d"], env=env, capture_output=True, text=True, timeout=timeout)
        if started.returncode != 0:
            stop_mps(folder)
            return False, f"nvidia-cuda-mps-control -d: exit {started.returncode} {started.stderr.strip()[:200]}"
        client = {**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
        probe = subprocess.run([python, "-c", PROBE], env=client, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_mps(folder)
        return False, f"MPS did not answer within {timeout:.0f} s"
    if probe.returncode != 0:
        stop_mps(folder)
        lines = (probe.stderr.strip() or "no output").splitlines()
        return False, f"a CUDA client under MPS failed: {lines[-1][:200]}"
    return True, probe.stdout.strip()


def stop_mps(folder: str, timeout: float = 20) -> None:
    """Stop the MPS daemon of ``folder`` (nothing where none was started there)."""
    control = shutil.which("nvidia-cuda-mps-control")
    if not control or not os.path.isdir(os.path.join(folder, "pipe")):
        return
    env = {**os.environ, **mps_env(folder)}
    try:
        subprocess.run([control], input="quit\n", env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


def main(argv=None) -> None:
    """``python -m bno_hvd.lab.gpushares SPEC -- COMMAND...``: COMMAND in this rank's environment."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m bno_hvd.lab.gpushares SPEC -- COMMAND... (under torchrun)")
    try:
        env = rank_env(argv[0], int(os.environ.get("LOCAL_RANK", "0")))
    except UsageError as err:
        sys.exit(str(err))
    os.execvpe(argv[2], argv[2:], {**os.environ, **env})


if __name__ == "__main__":
    main()
