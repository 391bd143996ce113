"""Exact BatchNorm and the GradScaler of a rank back from sitting out, through the library API.

Usage (under mpirun; one process gives the reference)::

    python exact_cases.py DATA_ROOT OUT_DIR MODE:MODEL[:plain] ...

One job runs every case given, one after another, each writing to ``OUT_DIR/MODE-MODEL[-plain]/``
(a job's start-up costs more than most cases: the tests start 3 jobs, not 9).

- ``MODE dropin``: a plain Horovod loop with ``bno.DataLoader`` / ``bno.DistributedOptimizer``
  (``op=hvd.Average``: each rank's gradients are weighted, not its loss) and ``bno.exact(model)``;
  ``plain`` leaves the model as it is (with a rank at 1 sample, torch's BatchNorm1d refuses the
  batch). Rank 0 saves the model (``model.pt``). With ``--dropin=ddp`` among the cases the loop is
  a DDP script's instead: torch.distributed on Gloo (set up from the MPI world) and
  ``bno.DistributedDataParallel`` (its hook weights each rank's gradients).
- ``MODE sitout``: bno-hvd's own loop pieces (``Balancer(sit_out=True)``, its loader,
  :class:`~bno_hvd.library.catchup.CatchUp`) with rank 3 at 0 samples for some updates, float64.
- ``MODE multisit``: as ``sitout``, with several ranks out at once (up to 3 of 4), five sets of
  ranks out in turn (a later set replaces the least recently used: at most ``LIVE`` are kept);
  ``--engine=torch`` among the cases runs the job on torch.distributed instead of Horovod,
  ``--collectives=gloo`` Horovod's collectives on Gloo (its process sets meet at a rendezvous).
- ``MODE float16`` / ``bfloat16``: as ``sitout``, under CPU autocast of that type with
  ``torch.amp.GradScaler("cpu")`` whose scale doubles every 2 steps (so it moves while rank 3 is
  out).

Every rank (a one-rank run too) trains 12 updates (``resnet18``: 4) of 16 samples (global batch)
of the real Fashion-MNIST; with 4 ranks the split follows :data:`SPLITS`, one entry per 2 updates,
a rank at 1 sample in each. ``resnet18`` is torchvision's, on the 28x28 images as they are (its
layer4 maps are 1x1, so a rank at 1 sample has one value per channel there: only the global
batch's statistics can normalise it). After every update each rank reports, on a communicator of
its own, whether it computed, its loss scale and the largest difference of its parameters and
buffers from rank 0's (broadcast); rank 0 writes them to ``updates.json``.
"""

import json
import os
import sys

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from mpi4py import MPI
from torchvision import datasets, transforms

import bno_hvd as bno
from bno_hvd.allocation import Strategy, make_strategy
from bno_hvd.data.models import InputAdapter
from bno_hvd.library.balancer import Balancer
from bno_hvd.library.catchup import CatchUp
from bno_hvd.processes.collectives import optimizer_step, submit_gradients
from bno_hvd.processes.world import init_world

UPDATES, GLOBAL, SEED = 12, 16, 5
SPLITS = {  # every 2 updates; a rank at 1 in each; rank 3 sits out (0) in the second and third
    "dropin": [[1, 7, 3, 5], [6, 1, 4, 5], [9, 2, 4, 1], [1, 1, 5, 9], [4, 1, 3, 8], [2, 5, 8, 1]],
    "sitout": [[1, 7, 3, 5], [6, 1, 9, 0], [8, 4, 4, 0], [1, 1, 5, 9], [4, 1, 3, 8], [2, 5, 8, 1]],
    "multisit": [[3, 5, 2, 6], [5, 0, 11, 0], [6, 3, 0, 7], [16, 0, 0, 0], [4, 0, 0, 12], [2, 5, 9, 0]],
}


class Splits(Strategy):
    """The split of :data:`SPLITS`, changed at every rebalance (every 2 updates)."""

    name = "splits"

    def __init__(self, splits):
        super().__init__(len(splits[0]), 4, global_batch=GLOBAL)
        self.splits = splits

    def initial(self):
        return list(self.splits[0])

    def rebalance(self, metrics, current, update):
        self._begin(metrics, current)
        return list(self.splits[(update // 2) % len(self.splits)])


def model_named(name):
    if name == "mlp":  # BatchNorm1d on (N, 32) features: a rank of 1 sample is one value per channel
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
    return InputAdapter(torchvision.models.get_model(name, num_classes=10), None, channels=3)


def strategy_for(mode, size):
    if size == 1:
        return make_strategy("fixed", 1, GLOBAL, batch_sizes=[GLOBAL])
    return Splits(SPLITS[mode if mode in SPLITS else "sitout"])


class Reports:
    """After each update: every rank's (computed, scale, difference from rank 0's state) -> rank 0's
    table. Rank 0's state goes out in one buffer broadcast (resnet18's is 90 MB: gathering every
    rank's state as Python objects cost more than the training)."""

    def __init__(self, comm):
        self.comm, self.rows = comm, []

    def add(self, sizes, computed, model, scaler, sets=0):
        state = torch.cat([t.detach().double().flatten() for t in model.state_dict().values()])
        ref = state.clone()
        self.comm.Bcast(ref.numpy(), root=0)
        scale = scaler.get_scale() if scaler is not None else None
        everyone = self.comm.gather((computed, scale, float((state - ref).abs().max())), root=0)
        if everyone is not None:
            self.rows.append(
                {
                    "sizes": list(sizes),
                    "computed": [c for c, _, _ in everyone],
                    "scales": [s for _, s, _ in everyone],
                    "diff": [d for _, _, d in everyone],
                    "sets": sets,  # process sets of ranks that compute, made and kept
                }
            )


def run_dropin(mode, model_name, data, plain, ddp=False):
    updates = UPDATES // 3 if model_name == "resnet18" else UPDATES  # 2 splits: resnet18 is the costly one
    size = torch.distributed.get_world_size() if ddp else hvd.size()
    bal = bno.Balancer.for_world(data, 4, strategy_for(mode, size), seed=SEED, rebalance_every=2)
    loader = bno.DataLoader(data, sampler=bal)
    model = model_named(model_name)
    if not plain:
        model = bno.exact(model, bal)
    if ddp:  # a DDP script: the hook weights the gradients; DDP sends rank 0's parameters itself
        model = bno.DistributedDataParallel(model, balancer=bal)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = bno.DistributedOptimizer(optimizer, model.named_parameters(), balancer=bal)
    reports, done = Reports(MPI.COMM_WORLD.Dup()), 0
    while done < updates:
        for images, labels in loader:
            sizes = bal.current_step.batch_sizes
            optimizer.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
            reports.add(sizes, True, model, None)
            done += 1
            if done == updates:
                break
    return (model.module if ddp else model), reports


def run_sitout(world, mode, model_name, data):
    bal = Balancer(
        world.control_comm, strategy_for(mode, world.size), len(data), seed=SEED, rebalance_every=2, sit_out=True
    )
    loader = bal.loader(data)
    model = bno.exact(model_named(model_name), bal, process_sets=world.sit_out_sets)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    engine = world.hvd  # horovod.torch, or the torch engine's collectives
    engine.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = engine.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=engine.Sum)
    amp = mode in ("float16", "bfloat16")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2) if amp else None
    sit_out = CatchUp(world, model, optimizer, scaler)
    reports = Reports(world.control_comm.Dup())
    for batch in bal.batches(loader, UPDATES):
        sit_out.begin(bal.batch_sizes)
        step = bal.start_step(batch)
        if step.size:
            optimizer.zero_grad()
            images, labels = batch.data
            if scaler is None:
                (F.cross_entropy(model(images), labels) * step.weight).backward()
            else:
                with torch.autocast("cpu", dtype=getattr(torch, mode)):
                    loss = F.cross_entropy(model(images), labels) * step.weight
                scaler.scale(loss).backward()
            submit_gradients(optimizer)
            optimizer_step(optimizer, scaler)
        bal.end_compute()
        bal.end_step()
        reports.add(step.batch_sizes, step.size > 0, model, scaler, len(world.sit_out_sets or ()))
    sit_out.catch_up()
    reports.add([1] * world.size, True, model, scaler)  # after the last catch-up: every rank alike
    return model, reports


def main():
    root, out, *cases = sys.argv[1:]
    engine = "torch" if "--engine=torch" in cases else "horovod"
    collectives = "gloo" if "--collectives=gloo" in cases else "mpi"
    ddp = "--dropin=ddp" in cases
    cases = [c for c in cases if not c.startswith("--")]
    if ddp:
        from bno_hvd.processes.torchenv import init_process_group

        init_process_group("gloo")
    torch.set_num_threads(1)
    data = datasets.FashionMNIST(root, train=True, transform=transforms.ToTensor(), download=False)
    # the sit-out modes need bno-hvd's world (Horovod's process sets); the drop-in's hvd.init() is
    # then a script's call on a started Horovod
    world = None if all(c.startswith("dropin:") for c in cases) else init_world(collectives, "cpu", engine=engine)
    for case in cases:
        mode, model_name, *plain = case.split(":")
        torch.set_default_dtype(torch.float64 if mode in ("dropin", "sitout", "multisit") else torch.float32)
        torch.manual_seed(SEED)
        if mode == "dropin":
            if not ddp and not hvd.is_initialized():
                hvd.init()
            model, reports = run_dropin(mode, model_name, data, plain == ["plain"], ddp)
        else:
            model, reports = run_sitout(world, mode, model_name, data)
        if (world.rank if world else MPI.COMM_WORLD.Get_rank()) == 0:
            where = os.path.join(out, case.replace(":", "-"))
            os.makedirs(where)
            torch.save(model.state_dict(), os.path.join(where, "model.pt"))
            with open(os.path.join(where, "updates.json"), "w") as fh:
                json.dump(reports.rows, fh)


if __name__ == "__main__":
    main()
