"""What exact BatchNorm costs per update against plain (per-rank) BatchNorm, measured in one run.

Two runs of ``bno-hvd train`` (the same config but for ``--exact-batchnorm`` / ``--local-batchnorm``)
live in one job, as ``bno-hvd bench --rounds`` interleaves strategies: an untimed warm-up of each,
then R rounds of one block of updates per run, in a new random order per round. Rank 0 prints
each run's samples/s per round and the paired ratio exact / plain (median and a 95% bootstrap
interval): below 1 by what the two small allreduces per BatchNorm layer (forward and backward)
and the layer's arithmetic (torch's kernels around them) cost.

    .venv/bin/python benchmarks/batchnorm_cost.py [--np 4] [--model resnet18] [--speeds 1,1,1,0.33]
        [--updates 100] [--warmup 20] [--rounds 4] [--batch 32] [--emulate-rate 200]

``--kernel 32,10,24,24`` times the layer's arithmetic alone instead, in this process on one thread:
the CPU time of a forward and backward of ``GlobalBatchNorm``'s function (its reductions add
nothing) and of torch's own BatchNorm on an input of that shape, median of 7 rounds of 50 each.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ("exact", "plain")


def rank_main(args) -> None:
    from bno_hvd.lab.pairing import block_rate, median_interval, paired_ratios, round_orders
    from bno_hvd.lab.plugin import check_lab_config, lab_plugin
    from bno_hvd.processes.world import init_world
    from bno_hvd.training.config import TrainConfig
    from bno_hvd.training.loop import Training

    base = TrainConfig(
        model=args.model,
        strategy=args.strategy,
        base_batch_size=args.batch,
        updates=args.updates,
        emulate_speed=tuple(float(s) for s in args.speeds.split(",")),
        emulate_rate=args.emulate_rate,
        eval=False,
        progress=False,
    )
    check_lab_config(base)
    world = init_world(base.collectives, base.device)
    block = (args.updates - args.warmup) // args.rounds
    trainings = {}
    for name in NAMES:  # each with its own communicators (world.fork): the runs' messages never mix
        cfg = base.replace(exact_batchnorm=name == "exact")
        trainings[name] = Training(cfg, world.fork(), plugin=lab_plugin)
        trainings[name].suspend()
    rates = {name: [] for name in NAMES}

    def run_block(name, updates):
        trainings[name].resume()
        try:
            return trainings[name].advance(updates)
        finally:
            trainings[name].suspend()

    for name in NAMES:
        run_block(name, args.updates - args.rounds * block)  # warm-up, untimed
    orders = world.control_comm.bcast(round_orders(list(NAMES), args.rounds, 0) if world.master else None, root=0)
    for order in orders:
        for name in order:
            rates[name].append(block_rate(run_block(name, block)))
    for name in NAMES:
        trainings[name].resume()
        trainings[name].finish()
    if world.master:
        ratios = paired_ratios(rates, "plain")["exact"]
        print(json.dumps({"rates": rates, "ratio": median_interval(ratios)}), flush=True)


def kernel(shape: list[int]) -> None:
    """The CPU ms of one forward and backward, exact BatchNorm's arithmetic against torch's BatchNorm."""
    import time

    import torch

    from bno_hvd.library.batchnorm import UpdateContext, _GlobalNorm

    torch.set_num_threads(1)
    ref, x0 = torch.nn.BatchNorm2d(shape[1]), torch.randn(shape)
    dy, context = torch.randn(shape), UpdateContext(lambda tensor, name: None, 1.0, 0)

    def step(exact: bool) -> None:
        x, stats = x0.clone().requires_grad_(), (ref.running_mean.clone(), ref.running_var.clone())
        if exact:
            y = _GlobalNorm.apply(x, ref.weight, ref.bias, *stats, 0.1, ref.eps, context, "layer")
        else:
            y = torch.nn.functional.batch_norm(x, *stats, ref.weight, ref.bias, True, 0.1, ref.eps)
        y.backward(dy)

    times = {"exact": [], "torch": []}
    for _ in range(7):
        for name in times:
            step(name == "exact")
            start = time.thread_time()
            for _ in range(50):
                step(name == "exact")
            times[name].append((time.thread_time() - start) / 50 * 1e3)
    for name, values in times.items():
        print(f"{name} BatchNorm, forward and backward of {tuple(shape)}: {sorted(values)[3]:.2f} ms of CPU (median)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--strategy", default="balanced")
    parser.add_argument("--speeds", default="1,1,1,0.33", help="EMULATED speed per rank")
    parser.add_argument("--emulate-rate", type=float, default=200.0, help="samples/s of a speed-1 rank")
    parser.add_argument("--updates", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="base batch per rank")
    parser.add_argument("--kernel", help="N,C,H,W: time the layer's arithmetic alone on this shape")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kernel:
        kernel([int(n) for n in args.kernel.split(",")])
        return 0
    if (args.updates - args.warmup) // args.rounds < 1:
        parser.error("(--updates - --warmup) / --rounds must leave blocks of at least 1 update")
    if args.rank:
        rank_main(args)
        return 0
    from bno_hvd.cli.launching import mpi_env, mpirun

    argv = [sys.executable, os.path.abspath(__file__), "--rank", *sys.argv[1:]]
    env = mpi_env(extra={"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    proc = mpirun(args.np, argv, timeout=3600, env=env, cwd=ROOT, tag_output=False)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return 1
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    block = (args.updates - args.warmup) // args.rounds
    print(
        f"{args.np} ranks, {args.model}, EMULATED {args.speeds}, {args.strategy}, base batch {args.batch}; "
        f"{args.rounds} rounds of {block} updates per run, random order each round"
    )
    for name in NAMES:
        print(f"{name + ' BatchNorm':<18}" + " ".join(f"{r:8.1f}" for r in result["rates"][name]) + "  samples/s")
    median, low, high = result["ratio"]
    print(
        f"exact / plain samples/s, paired per round: {median:.3f} (95% interval {low:.3f}-{high:.3f}); "
        f"time per update x{1 / median:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
