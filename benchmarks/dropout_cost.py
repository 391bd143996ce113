"""What exact dropout costs per forward and backward against the model's own dropout, in one process.

The ``Net`` of ``examples/horovod_mnist.py`` (a Dropout2d and an F.dropout), float32, one thread,
on random images: ``plain`` is the model as written, ``exact`` the same model under
:func:`bno_hvd.exact_dropout`, its rows the samples of a one-rank Balancer's loader (a new batch
each round, as in a script). After a warm-up, each round times one forward + backward of every
variant in a new random order; the script prints each variant's median time and its paired ratio
to ``plain`` (median of the per-round ratios, with a 95% bootstrap interval). ``torch-masks`` is
``exact`` with its masks computed by torch operations, as on a GPU, instead of numpy's on the CPU:
what the numpy path saves (bno_hvd/library/dropmask.py).

    .venv/bin/python benchmarks/dropout_cost.py [--rounds 2000] [--warmup 100] [--batch 32]

``--extra NAME=FILE`` adds a variant whose ``exact_dropout`` comes from another file (an older
``bno_hvd/library/dropout.py`` from ``git show``), to compare two versions in one run.
"""

import argparse
import contextlib
import copy
import importlib.util
import json
import math
import os
import sys
import time
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

from bno_hvd.library import dropout
from bno_hvd.library.dropmask import mask_bits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_exact_dropout(path: str):
    spec = importlib.util.spec_from_file_location(f"dropout_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.exact_dropout


def step_time(model, images, labels) -> float:
    """Seconds of one forward and backward."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    F.nll_loss(model(images), labels).backward()
    return time.perf_counter() - start


def measure(args) -> dict:
    """Per variant, its seconds per forward + backward in each round (after the warm-up)."""
    from mpi4py import MPI

    import bno_hvd as bno

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from horovod_mnist import Net

    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = Net()
    images, labels = torch.randn(args.batch, 1, 28, 28), torch.randint(0, 10, (args.batch,))
    samples = (args.warmup + args.rounds + 1) * args.batch
    balancer = bno.Balancer(MPI.COMM_SELF, bno.make_strategy("equal", 1, args.batch), samples, seed=1)
    batches = iter(bno.DataLoader(list(range(samples)), sampler=balancer, seed_samples=False))
    exact = lambda m: bno.exact_dropout(m, balancer)  # noqa: E731
    makers = {"plain": lambda m: m, "exact": exact, "torch-masks": exact}
    for spec in args.extra:
        name, path = spec.split("=", 1)
        makers[name] = lambda m, f=load_exact_dropout(path): f(m, balancer)
    models = {name: make(copy.deepcopy(base)).train() for name, make in makers.items()}
    # the ablation: masks by torch operations on the CPU too, as on a GPU, instead of numpy's
    contexts = {name: contextlib.nullcontext() for name in models}
    contexts["torch-masks"] = mock.patch.object(dropout, "scaled_mask", torch_scaled_mask)
    rng = np.random.default_rng(0)
    times = {name: [] for name in models}
    names = list(models)
    for round_ in range(args.warmup + args.rounds):
        next(batches)  # a new batch per round, untimed: the forwards' rows are its samples
        for i in rng.permutation(len(names)):
            with contexts[names[i]]:
                seconds = step_time(models[names[i]], images, labels)
            if round_ >= args.warmup:
                times[names[i]].append(seconds)
    return times


def torch_scaled_mask(terms, shape, p, like):
    keep = mask_bits(torch.from_numpy(terms), math.prod(shape)) >= math.ceil(p * 2**32)
    return keep.view(-1, *shape).to(like.dtype).mul_(1.0 / (1.0 - p) if p < 1 else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000, help="timed rounds, one step of each variant [2000]")
    parser.add_argument("--warmup", type=int, default=100, help="untimed rounds first [100]")
    parser.add_argument("--batch", type=int, default=32, help="samples per forward [32]")
    parser.add_argument("--extra", action="append", default=[], help="NAME=FILE: another exact_dropout's module")
    parser.add_argument("--json", help="write the per-round times here")
    args = parser.parse_args()
    from bno_hvd.lab.pairing import median_interval, paired_ratios

    times = measure(args)
    ratios = paired_ratios(times, "plain")
    for name, values in times.items():
        median, low, high = median_interval(ratios[name])
        print(
            f"{name:<10} {np.median(values) * 1e3:7.3f} ms per forward+backward   "
            f"x plain {median:.3f} [{low:.3f}, {high:.3f}]"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(times, f)


if __name__ == "__main__":
    main()
