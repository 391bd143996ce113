"""Which collectives `--collectives auto` should pick: MPI against Gloo, jobs alternated in pairs.

Each pair runs the same 4-rank `bno-hvd train` twice, once with `--collectives mpi` and once with
`--collectives gloo` (which one first alternates), and divides the two samples/s; the median of
those paired ratios and a bootstrap 95% interval are printed (bno_hvd/lab/pairing.py). Extra
arguments go to `bno-hvd train` (e.g. `--cpu-quota 0.45,0.45,0.45,0.15`).

    python benchmarks/collectives.py --pairs 4 --updates 300
    python benchmarks/collectives.py --pairs 4 --updates 150 -- --cpu-quota 0.45,0.45,0.45,0.15
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from bno_hvd.cli.launching import mpirun_command
from bno_hvd.lab.pairing import median_interval
from bno_hvd.processes.mpienv import mpi_env


def one_job(collectives: str, updates: int, extra: list[str]) -> float:
    """samples/s of one training job (rank 0's result.json)."""
    with tempfile.TemporaryDirectory() as log:
        cmd = [sys.executable, "-m", "bno_hvd", "train", "--updates", str(updates), "--no-eval", "--no-progress"]
        cmd += ["--collectives", collectives, "--log-dir", log, *extra]
        subprocess.run(mpirun_command(4, cmd), check=True, capture_output=True, env=mpi_env())
        with open(os.path.join(log, "result.json")) as fh:
            result = json.load(fh)
    return result["samples"] / result["wall_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("extra", nargs="*", help="arguments for bno-hvd train (after --)")
    args = ap.parse_args()
    ratios = []
    for k in range(args.pairs):
        order = ("mpi", "gloo") if k % 2 == 0 else ("gloo", "mpi")
        rate = {c: one_job(c, args.updates, args.extra) for c in order}
        ratios.append(rate["gloo"] / rate["mpi"])
        print(f"pair {k + 1}: mpi {rate['mpi']:.1f} samples/s, gloo {rate['gloo']:.1f}: gloo/mpi {ratios[-1]:.2f}")
    median, low, high = median_interval(ratios, seed=0)
    print(f"gloo / mpi over {args.pairs} pairs: median {median:.2f} [95% interval {low:.2f}, {high:.2f}]")


if __name__ == "__main__":
    main()
