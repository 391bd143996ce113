"""Scale on paper: `bno-hvd allocate` on generated N-rank metrics files, and the latency
probe's cost per rank as N grows (all pairs vs sampled rounds). Prints tables; asserts nothing.

    .venv/bin/python benchmarks/scale.py            # (uses bno_hvd.cli.launching's MPI settings itself)
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

from bno_hvd.cli.launching import mpi_env, mpirun
from bno_hvd.library.control.schedule import rounds_for_refresh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_metrics(n, path, dense, seed=0):
    rng = np.random.default_rng(seed)
    if dense:
        lat = rng.uniform(1e-5, 1e-3, (n, n))
        lat = (lat + lat.T) / 2
        np.fill_diagonal(lat, 0)
        latency = lat.tolist()
    else:
        pairs = []
        for rnd in rounds_for_refresh(n, 0, 8):
            for i, j in rnd:
                v = float(rng.uniform(1e-5, 1e-3))
                pairs += [[i, j, v], [j, i, v]]
        latency = {"pairs": pairs}
    with open(path, "w") as fh:
        json.dump(
            {
                "ops": rng.uniform(50, 500, n).tolist(),
                "memory_used": rng.uniform(1e8, 4e9, n).tolist(),
                "latency": latency,
            },
            fh,
        )


def time_allocate(path, strategy):
    bno = os.path.join(os.path.dirname(sys.executable), "bno-hvd")
    t0 = time.perf_counter()
    out = subprocess.run(
        [bno, "allocate", "--metrics", path, "--strategy", strategy],
        capture_output=True,
        text=True,
        env=mpi_env(),
        check=True,
    ).stdout
    wall = time.perf_counter() - t0
    sizes = json.loads(out)["batch_sizes"]
    return wall, len(sizes), sum(sizes)


def allocate_table():
    print("bno-hvd allocate, whole command wall time (process start, JSON parse, validation, allocation)")
    print(f"{'ranks':>6} {'latency':>8} {'file MB':>8} {'strategy':>9} {'wall s':>7} {'global batch':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for n, dense in ((64, True), (512, True), (4096, False), (4096, True)):
            path = os.path.join(tmp, f"m{n}{dense}.json")
            write_metrics(n, path, dense)
            mb = os.path.getsize(path) / 1e6
            for strategy in ("bno", "balanced"):
                wall, count, total = time_allocate(path, strategy)
                assert count == n
                print(f"{n:>6} {'dense' if dense else 'sampled':>8} {mb:>8.1f} {strategy:>9} {wall:>7.2f} {total:>13}")


def probe_table(sizes=(2, 4, 8)):
    print("\nlatency probe cost per rank (64 KiB ping-pong, 3 repeats; all pairs vs --max-rounds 2)")
    print(f"{'ranks':>6} {'rounds':>7} {'exchanges/rank':>15} {'probe ms (max over ranks)':>27}")
    for n in sizes:
        for rounds in (None, 2):
            args = [sys.executable, "-m", "bno_hvd", "probe", "--steps", "1", "--repeats", "3"]
            if rounds:
                args += ["--max-rounds", str(rounds)]
            proc = mpirun(n, args, timeout=300, cwd=ROOT)
            if proc.returncode != 0:
                print(proc.stderr[-2000:])
                raise SystemExit(1)
            ms = [
                float(m.group(1))
                for m in re.finditer(r"^\S*\s*\d+\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)$", proc.stdout, re.M)
            ]
            used = min(rounds or n - 1, n - 1 if n % 2 == 0 else n)
            exchanges = used * 2 * (3 + 1)
            print(f"{n:>6} {('all' if rounds is None else rounds):>7} {exchanges:>15} {max(ms):>27.2f}")


if __name__ == "__main__":
    allocate_table()
    probe_table()
