"""What the DataLoader path costs against indexing an in-memory tensor (the path before it).

Every rank trains the baseline CNN on Fashion-MNIST with the same equal allocation, first by
indexing the in-memory tensors with ``step.indices``, then through ``Balancer.loader`` with 0, 1
and 2 worker processes, all in one job, and rank 0 prints samples/s per mode and the ratio to the
in-memory path (measured in one run, after warm-up).

    .venv/bin/python benchmarks/loader_overhead.py [--np 4] [--updates 150] [--batch 32]
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("memory", "loader-0", "loader-1", "loader-2")


def rank_main(updates: int, batch: int, warmup: int) -> None:
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F
    from mpi4py import MPI

    from bno_hvd import Balancer, make_strategy
    from bno_hvd.data.images import load_dataset
    from bno_hvd.data.models import build_model
    from bno_hvd.processes.collectives import wait_for_allreduce

    hvd.init()
    torch.set_num_threads(1)
    data = load_dataset("fashion-mnist", "train")
    x_all, y_all = data.tensors
    results = {}
    for mode in MODES:
        torch.manual_seed(0)
        model = build_model("cnn")
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Sum)
        bal = Balancer(MPI.COMM_WORLD.Dup(), make_strategy("equal", hvd.size(), batch), len(data))
        if mode == "memory":
            batches = (None for _ in range(updates))
        else:
            workers = int(mode.split("-")[1])
            loader = bal.loader(data, num_workers=workers, persistent_workers=workers > 0)
            batches = bal.batches(loader, updates)
        t_start = None
        for batch_ in batches:
            if bal.update == warmup:
                MPI.COMM_WORLD.Barrier()
                t_start = time.perf_counter()
            step = bal.start_step(batch_)
            x, y = (x_all[step.indices], y_all[step.indices]) if batch_ is None else batch_.data
            opt.zero_grad()
            (F.cross_entropy(model(x), y) * step.weight).backward()
            bal.end_compute()
            wait_for_allreduce(hvd, opt)
            opt.step()
            bal.end_step()
        MPI.COMM_WORLD.Barrier()
        seconds = time.perf_counter() - t_start
        results[mode] = (updates - warmup) * batch * hvd.size() / seconds
        del opt, model, bal
    if hvd.rank() == 0:
        print(json.dumps(results), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--updates", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args.updates, args.batch, args.warmup)
        return 0
    from bno_hvd.cli.launching import mpi_env, mpirun

    argv = [
        sys.executable,
        os.path.abspath(__file__),
        "--rank",
        "--updates",
        str(args.updates),
        "--warmup",
        str(args.warmup),
        "--batch",
        str(args.batch),
    ]
    env = mpi_env(extra={"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    proc = mpirun(args.np, argv, timeout=3600, env=env, cwd=ROOT, tag_output=False)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return 1
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"{args.np} ranks, CNN, Fashion-MNIST, equal allocation of {args.batch} per rank, "
        f"{args.updates - args.warmup} measured updates (no emulation: real ranks of this machine)"
    )
    print(f"{'data path':<12}{'samples/s':>11}{'vs in-memory':>14}")
    for mode in MODES:
        print(f"{mode:<12}{results[mode]:>11.1f}{results[mode] / results['memory']:>13.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
