"""What the DDP drop-in costs per update against plain DDP, part by part, in one job.

Every rank of a torchrun job trains the ``Net`` of ``examples/ddp_mnist.py`` (float32, one thread)
in two kinds of model: torch's DDP over a ``DistributedSampler``'s DataLoader (``plain``), and
``bno.DistributedDataParallel`` over a Balancer's ``bno.DataLoader`` at ``equal`` (the same even
split), in four variants, each its own model, Balancer and loader:

- ``bare``: the drop-in alone (the weighting hook, the step's ends, the loader; no rebalance);
- ``dropout``: with ``bno.exact_dropout``;
- ``rebalance``: rebalancing every tenth update (the example's default: a report's gather, rank
  0's decision, its broadcast);
- ``both``: the example as ported.

The samples are random images in memory, read one by one as a file-backed data set is. Each round
times, for every variant in turn, a block of updates of ``plain`` and then one of the variant; the
CPU of the whole process (``time.process_time``: Gloo's threads too) over each block. Rank 0 prints
per variant the median CPU per update of both and the median of the paired differences and ratios.

    .venv/bin/python benchmarks/ddp_cost.py [--np 4] [--rounds 12] [--block 50]

On a machine with fewer cores than ranks the ranks share them (4 on 2 here): the CPU per update is
then higher than alone, for both kinds alike.
"""

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {"bare": (False, False), "dropout": (True, False), "rebalance": (False, True), "both": (True, True)}
WARMUP, BATCH, DISTINCT = 20, 32, 4096


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=4, help="ranks [4]")
    parser.add_argument("--rounds", type=int, default=12, help="paired blocks per variant [12]")
    parser.add_argument("--block", type=int, default=50, help="updates per block [50]")
    args = parser.parse_args()
    if args.np < 1 or args.rounds < 1 or args.block < 1:
        print("ddp_cost: error: --np, --rounds and --block are at least 1", file=sys.stderr)
        return 2
    if "BNO_DDP_COST" in os.environ:  # a rank of the job below
        return rank_main(args.rounds, args.block)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["BNO_DDP_COST"] = "1"
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--standalone", "--nproc-per-node", str(args.np), os.path.abspath(__file__)]
    return subprocess.call([*cmd, f"--rounds={args.rounds}", f"--block={args.block}"], env=env)


def rank_main(rounds: int, block: int) -> int:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data.distributed import DistributedSampler

    import bno_hvd as bno
    from bno_hvd.data.models import load_user_function

    net_class, _ = load_user_function("examples.ddp_mnist:Net")  # as train --model finds it (ROOT on the path)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()

    class Images(Dataset):  # DISTINCT random images, as many samples as the run reads
        def __init__(self, n: int):
            g = torch.Generator().manual_seed(0)
            self.images, self.labels = torch.randn(DISTINCT, 1, 28, 28, generator=g), torch.randint(0, 10, (DISTINCT,))
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return self.images[i % DISTINCT], self.labels[i % DISTINCT]

    data = Images((WARMUP + rounds * block) * BATCH * world * len(VARIANTS))

    def trainer(model, loader):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
        batches = iter(loader)
        model.train()

        def run(n: int) -> float:
            start = time.process_time()
            for _ in range(n):
                images, labels = next(batches)
                optimizer.zero_grad()
                torch.nn.functional.nll_loss(model(images), labels).backward()
                optimizer.step()
            return (time.process_time() - start) / n * 1e3

        return run

    torch.manual_seed(0)
    plain = trainer(
        torch.nn.parallel.DistributedDataParallel(net_class()),
        DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, seed=1)),
    )
    ports = {}
    for name, (dropout, rebalance) in VARIANTS.items():
        balancer = bno.Balancer.for_world(data, BATCH, "equal", seed=1, rebalance_every=10 if rebalance else 10**9)
        net = bno.exact_dropout(net_class(), balancer) if dropout else net_class()
        model = bno.DistributedDataParallel(net, balancer=balancer)
        ports[name] = trainer(model, bno.DataLoader(data, sampler=balancer))
    plain(WARMUP)
    for port in ports.values():
        port(WARMUP)
    times = {name: ([], []) for name in ports}
    for _ in range(rounds):
        for name, port in ports.items():
            times[name][0].append(plain(block))
            times[name][1].append(port(block))
    if dist.get_rank() == 0:
        print(f"| variant | plain ms CPU/update | drop-in | paired difference | × plain ({world} ranks, rank 0) |")
        print("|---|---|---|---|---|")
        for name, (a, b) in times.items():
            a, b = np.array(a), np.array(b)
            print(
                f"| {name} | {np.median(a):.2f} | {np.median(b):.2f} | "
                f"{np.median(b - a):+.2f} ms | {np.median(b / a):.3f} |"
            )
    return 0  # the drop-in frees the groups at exit, once the models are gone (docs/ddp.md)


if __name__ == "__main__":
    sys.exit(main())
