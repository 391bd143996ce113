"""Your own script against what you run today: the Horovod, DDP, Lightning, Accelerate and Hugging
Face Trainer ports against their plain twins, under REAL CPU limits set outside bno-hvd.

For each profile (a cgroup per rank with a CFS quota, made before the job and unknown to it, as a
container's or Slurm's: :mod:`bno_hvd.lab.confine`) and each kind of script, every round runs, in
a new random order, the plain twin of the example (``examples/horovod_mnist.py`` under mpirun,
``examples/ddp_mnist.py``, ``examples/lightning_mnist.py`` and ``examples/accelerate_mnist.py`` under
torchrun; the twin is the example with its ``# bno-hvd:`` lines put back) and the example itself
with each ``--strategy``;
``--scripts trainer`` runs ``examples/hf_trainer_text.py`` (a small GPT-2 on the built-in text
corpus, 8 sequences per rank, ``--max-steps`` = warm-up + updates; its rate counts sequences);
``--scripts train`` runs ``bno-hvd train`` on the Horovod example's model (same data, 32 samples
per rank) against that example's twin. Each run trains one epoch of a Fashion-MNIST subset
(``--warmup`` + ``--updates`` updates of 4 x 32 samples) at the scripts' own settings; rank 0's
samples/s comes from the end of every ``optimizer.step()`` (:mod:`bno_hvd.lab.stamps`), after the
warm-up. A plain DDP script may hang in Gloo's teardown after its last line
(pytorch/pytorch#56297): a job still running 30 s after rank 0 wrote its done file is ended.
Prints a Markdown table (each run's median samples/s, its ratio to the plain script paired per
round with a 95% bootstrap interval) and writes ``OUT/dropin_real.json``. As root (cgroups),
alone on the machine:

    .venv/bin/python benchmarks/dropin_real.py --profiles outside-10ms,outside-equal-10ms --rounds 3
    .venv/bin/python benchmarks/dropin_real.py --scripts lightning --strategies balanced --rounds 5

Profiles: those of ``bno_hvd.lab.profiles`` whose limits are set outside (``outside-*``), that
start competing processes (``competing-process``), or ``unlimited`` (no limit at all); the
``quota-*`` and ``emulated-*`` ones are bno-hvd's own flags, which a user's script does not have.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import date

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "support")]

from bno_hvd.cli.launching import mpirun_command  # noqa: E402
from bno_hvd.lab.pairing import round_orders  # noqa: E402
from bno_hvd.lab.profiles import BY_NAME, Confinement  # noqa: E402
from bno_hvd.lab.userscripts import (  # noqa: E402
    PER_RANK,
    SCRIPTS,
    TABLE_HEAD,
    TWIN_OF,
    format_rows,
    stamps_cpu,
    stamps_rate,
    summarize,
    variants,
)
from bno_hvd.processes.mpienv import mpi_env  # noqa: E402

RANKS, BATCH = 4, 32
JOB_TIMEOUT, EXIT_GRACE = 900, 30  # s: a whole run; after rank 0's done file (its steps are all we read)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default="outside-10ms,outside-equal-10ms")
    parser.add_argument("--scripts", default="horovod,ddp", help="kinds of script: " + ", ".join(SCRIPTS))
    parser.add_argument(
        "--strategies", default="balanced,equal", help="the port's --strategy per run (more of its flags after a space)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=200, help="timed updates per run")
    parser.add_argument("--warmup", type=int, default=30, help="updates before the timing starts")
    parser.add_argument("--seed", type=int, default=0, help="the rounds' orders")
    parser.add_argument("--out", default=None, help="where runs and the JSON go [a new temporary folder]")
    args = parser.parse_args()
    profiles = [BY_NAME.get(name) for name in args.profiles.split(",")]
    bad = [n for n, p in zip(args.profiles.split(","), profiles) if p is None or p.flags or p.schedule]
    if bad or args.rounds < 1 or args.warmup < 1 or args.updates < 2:
        print(
            f"dropin_real: error: profiles set outside bno-hvd only (not {', '.join(bad)})"
            if bad
            else "dropin_real: error: --rounds >= 1, --warmup >= 1, --updates >= 2",
            file=sys.stderr,
        )
        return 2
    kinds = args.scripts.split(",")
    out = args.out or tempfile.mkdtemp(prefix="dropin-real-")
    data, twins = prepare(out, args.warmup + args.updates)
    results = {"date": str(date.today()), "commit": commit(), "args": vars(args), "profiles": {}}
    lines = [TABLE_HEAD]
    for profile in profiles:
        runs = [v for kind in kinds for v in variants(kind, args.strategies.split(","))]
        rates = {(v.kind, v.name): [] for v in runs}
        with Confinement(profile) as confined:
            for r, order in enumerate(round_orders([f"{v.kind}/{v.name}" for v in runs], args.rounds, args.seed)):
                for label in order:
                    variant = next(v for v in runs if f"{v.kind}/{v.name}" == label)
                    where = os.path.join(
                        out, profile.name, f"round{r}", label.replace("/", "-").replace(":", "-").replace(" ", "")
                    )
                    steps, cpu = run(variant, where, twins, data, confined, args.warmup + args.updates)
                    rate = stamps_rate(steps, RANKS * PER_RANK.get(variant.kind, BATCH), args.warmup)
                    rates[(variant.kind, variant.name)].append(rate)
                    print(
                        f"{profile.name} round {r}: {label} {rate:.1f} samples/s ({len(steps)} updates; "
                        f"rank 0's CPU {stamps_cpu(cpu, args.warmup):.1f} ms per update)",
                        flush=True,
                    )
        results["profiles"][profile.name] = {"label": profile.label(), "scripts": {}}
        for kind in kinds:
            table = summarize({name: v for (k, name), v in rates.items() if k == kind})
            results["profiles"][profile.name]["scripts"][kind] = table
            lines += format_rows(profile.name, kind, table)
    with open(os.path.join(out, "dropin_real.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    print("\n".join(lines))
    print(f"(REAL CPU limits set outside bno-hvd; {args.rounds} rounds; {out}/dropin_real.json)")
    return 0


def prepare(out: str, updates: int) -> tuple[str, dict]:
    """A Fashion-MNIST subset of one epoch of ``updates`` global batches, and the plain twins."""
    from port_twin import example_source, plain_twin
    from run_port import write_fashion_subset

    data = write_fashion_subset(
        os.path.join(out, "data"), "/usr/share/datasets/fashion-mnist", updates * RANKS * BATCH, 500
    )
    twins = {}
    for kind, (example, _) in SCRIPTS.items():
        if kind in TWIN_OF:  # bno-hvd train: its plain script is another kind's twin
            continue
        source = os.path.join(ROOT, example)
        twins[kind] = os.path.join(out, f"plain_{os.path.basename(source)}")
        with open(twins[kind], "w") as fh:
            fh.write(plain_twin(example_source(source)))
    twins.update({kind: twins[of] for kind, of in TWIN_OF.items()})
    return data, twins


def script_args(variant, data: str, updates: int, where: str) -> list[str]:
    """What a run of ``variant`` is given: the examples' own flags for one epoch of the subset, or
    bno-hvd train's for as many updates, on the Horovod example's model at the same batch per rank."""
    if variant.kind == "train" and variant.script != "twin":
        return ["train", "--model", "examples.horovod_mnist:Net", "--data-dir", data, "--base-batch-size", str(BATCH),
                "--updates", str(updates), "--no-eval", "--no-progress", *variant.args]  # fmt: skip
    if variant.kind == "trainer":  # text: the built-in corpus, its own batch per rank, as many updates
        return ["--max-steps", str(updates), "--log-steps", "1000000", "--output-dir", where, *variant.args]
    args = ["--epochs", "1", "--batch-size", str(BATCH), "--data-dir", data]
    if variant.kind == "lightning":  # its logger and checkpoints in the run's folder; its own ranks count
        return [*args, "--devices", str(RANKS), "--log-dir", where, *variant.args]
    return [*args, "--log-interval", "1000000", *variant.args]


def run(variant, where: str, twins: dict, data: str, confined: dict, updates: int) -> tuple[list, list]:
    """One job of ``variant``; rank 0's step times and CPU times (empty if the job failed)."""
    os.makedirs(where)
    script = twins[variant.kind] if variant.script == "twin" else os.path.join(ROOT, variant.script)
    inner = ["python", "-m", "bno_hvd.lab.confine", "python", "-m", "bno_hvd.lab.stamps", where, script]
    inner += script_args(variant, data, updates, where)
    if variant.launcher == "mpirun":
        cmd = mpirun_command(RANKS, inner)
    else:
        cmd = ["torchrun", "--standalone", "--nproc-per-node", str(RANKS), "--no-python", *inner]
    env = mpi_env()
    env.update(confined, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    done = [os.path.join(where, "done-0")]
    with open(os.path.join(where, "output.txt"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        start, finished = time.monotonic(), None
        while proc.poll() is None:
            time.sleep(0.5)
            now = time.monotonic()
            if finished is None and all(os.path.exists(p) for p in done):
                finished = now
            if (finished is not None and now - finished > EXIT_GRACE) or now - start > JOB_TIMEOUT:
                os.killpg(proc.pid, 9)  # the whole job: the launcher and every rank under it
                proc.wait()
    stamps = os.path.join(where, "stamps-0.json")
    if not os.path.exists(stamps):
        print(f"dropin_real: {variant.kind}/{variant.name} failed; see {where}/output.txt", file=sys.stderr)
        return [], []
    with open(stamps) as fh:
        stamped = json.load(fh)
    return stamped["steps"], stamped["cpu"]


def commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return proc.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
