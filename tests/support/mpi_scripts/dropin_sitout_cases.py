"""Ranks that sit out in a user's own loop, through the drop-ins (``bno_hvd.library.sitout``).

Usage (under mpirun; one process gives the reference)::

    python dropin_sitout_cases.py DROPIN DATA_ROOT OUT_DIR CASE ...

``DROPIN``: ``horovod`` (``bno.DistributedOptimizer``) or ``ddp`` (torch.distributed on Gloo,
set up from the MPI world, and ``bno.DistributedDataParallel``). A case is ``SPLIT:MODEL``:

- ``SPLIT``: ``sitout`` (rank 3 out in the second and third split and back), ``multisit`` (up to
  three of four ranks out at once, five sets in turn), each split held for 2 updates; ``hand``: a
  ``fixed`` split 8,8,0,0 given by hand, from the first update;
- ``MODEL``: ``mlp`` (``BatchNorm1d``: a rank at 1 sample; exact through ``bno.exact``), ``net``
  (the examples' CNN with two dropouts, exact through ``bno.exact``), or ``amp`` (the ``mlp`` with a
  ``torch.amp.GradScaler`` whose scale doubles at every step, in Horovod's or torch's recipe);
- ``SPLIT:MODEL:N``: the loop leaves its ``for`` by a ``break`` once ``N`` updates are done.

The loop is a plain script's: ``for images, labels in loader: zero_grad, loss, backward, step``
(SGD with momentum, float64, one epoch of 12 updates of 16 samples; ``hand``: 6), nothing in it
knows of sitting out. Each rank notes, before every forward, the update and a hash of its model's
state; after the loop (the end of the epoch's ``for``, where the drop-in catches every rank up) the
hash again. Rank 0 writes
``OUT_DIR/DROPIN-SPLIT-MODEL/{model.pt,ranks.json}``.
"""

import hashlib
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from mpi4py import MPI
from torchvision import datasets, transforms

import bno_hvd as bno
from bno_hvd.allocation import Strategy, make_strategy

UPDATES, GLOBAL, SEED = 12, 16, 5
SPLITS = {  # every 2 updates; nobody out in the first split (DDP rebuilds its buckets at its second update)
    "sitout": [[1, 7, 3, 5], [6, 1, 9, 0], [8, 4, 4, 0], [1, 1, 5, 9], [4, 1, 3, 8], [2, 5, 8, 1]],
    "multisit": [[3, 5, 2, 6], [5, 0, 11, 0], [6, 3, 0, 7], [16, 0, 0, 0], [4, 0, 0, 12], [2, 5, 9, 0]],
}


class Splits(Strategy):
    name = "splits"

    def __init__(self, splits):
        super().__init__(len(splits[0]), 4, global_batch=GLOBAL)
        self.splits = splits

    def initial(self):
        return list(self.splits[0])

    def rebalance(self, metrics, current, update):
        self._begin(metrics, current)
        return list(self.splits[(update // 2) % len(self.splits)])


class Net(nn.Module):
    """The examples' CNN: a channel dropout and a plain one."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 10, 5), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(10, 20, 5), nn.Dropout2d(0.5),
            nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(),
        )  # fmt: skip
        self.hidden, self.classes = nn.Linear(320, 50), nn.Linear(50, 10)

    def forward(self, x):
        return self.classes(F.dropout(F.relu(self.hidden(self.features(x))), 0.5, self.training))


def model_named(name):
    if name in ("mlp", "amp"):
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
    return Net()


def strategy_for(split, size):
    if size == 1:
        return make_strategy("fixed", 1, GLOBAL, batch_sizes=[GLOBAL])
    if split == "hand":
        return make_strategy("fixed", size, 8, batch_sizes=[8, 8, 0, 0])
    return Splits(SPLITS[split])


def digest(model) -> str:
    flat = torch.cat([t.detach().reshape(-1) for t in model.state_dict().values()])
    return hashlib.sha1(flat.double().numpy().tobytes()).hexdigest()


def run(dropin, split, model_name, data, stop=None):
    size = MPI.COMM_WORLD.Get_size()
    data = torch.utils.data.Subset(data, range(GLOBAL * (UPDATES if split != "hand" else UPDATES // 2)))
    bal = bno.Balancer.for_world(data, 4, strategy_for(split, size), seed=SEED, rebalance_every=2)
    loader = bno.DataLoader(data, sampler=bal)
    model = bno.exact(model_named(model_name), bal)
    if dropin == "ddp":
        model = bno.DistributedDataParallel(model, balancer=bal)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        import horovod.torch as hvd

        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = bno.DistributedOptimizer(optimizer, model.named_parameters(), balancer=bal)
    # amp: a loss scale that doubles at every step, so that a rank back with an old scale would differ
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1) if model_name == "amp" else None

    def state():
        return digest(model) + ("" if scaler is None else f" scale {scaler.get_scale()}")

    seen = []  # (update, sizes, hash of the state before its forward) of each batch this rank computed
    for images, labels in loader:  # one epoch: the data set holds the updates' samples
        seen.append((bal.current_step.update, bal.current_step.batch_sizes, state()))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        if scaler is None:
            loss.backward()
            optimizer.step()
        elif dropin == "ddp":  # torch's recipe
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:  # Horovod's recipe
            scaler.scale(loss).backward()
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
            scaler.update()
        if stop is not None and bal.update >= stop:  # by the updates done: the same on every rank
            break
    return (model.module if dropin == "ddp" else model), seen, state()


def main():
    dropin, root, out, *cases = sys.argv[1:]
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    if dropin == "ddp":
        from bno_hvd.processes.torchenv import init_process_group

        init_process_group("gloo")
    else:
        import horovod.torch as hvd

        hvd.init()
    data = datasets.FashionMNIST(root, train=True, transform=transforms.ToTensor(), download=False)
    comm = MPI.COMM_WORLD.Dup()
    for case in cases:
        split, model_name, *stop = case.split(":")
        torch.manual_seed(SEED)
        model, seen, final = run(dropin, split, model_name, data, int(stop[0]) if stop else None)
        everyone = comm.gather({"seen": seen, "final": final}, root=0)
        if comm.Get_rank() == 0:
            where = os.path.join(out, f"{dropin}-{case.replace(':', '-')}")
            os.makedirs(where)
            torch.save(model.state_dict(), os.path.join(where, "model.pt"))
            with open(os.path.join(where, "ranks.json"), "w") as fh:
                json.dump(everyone, fh)


if __name__ == "__main__":
    main()
