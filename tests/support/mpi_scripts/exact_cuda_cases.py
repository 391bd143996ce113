"""Exact BatchNorm and a GradScaler across a sit-out on CUDA: the GPU twin of exact_cases.py, on
torch.distributed alone (the GPU machine has no Horovod), every rank on GPU 0 (Gloo sums CUDA
tensors; NCCL takes one rank per GPU).

Usage (under torchrun; 1 process gives the reference)::

    python exact_cuda_cases.py OUT_DIR MODE:MODEL[:plain] ... [--device=cpu]

- ``MODE ddp``: a DDP script's loop, ``bno.DistributedDataParallel`` and ``bno.exact(model)``,
  float64; ``plain`` leaves the model as it is (the 1-process reference). The split changes every
  2 updates with a rank at 1 sample (:data:`SPLITS`, as exact_cases.py).
- ``MODE float16``: bno-hvd's own loop pieces on the torch engine (``--collectives gloo``):
  ``Balancer(sit_out=True)``, :class:`~bno_hvd.library.catchup.CatchUp`, float16 autocast with
  ``torch.amp.GradScaler("cuda")`` whose scale doubles every 2 steps, rank 3 at 0 samples for a
  while (the scale moves while it is out).

``--device=cpu`` rehearses the same loops on the CPU (bfloat16 autocast, ``GradScaler("cpu")``), so
that the script is known to run before a GPU machine is lent. Samples are seeded random images
(no data set needed there). After every update each rank reports whether it computed, its loss
scale and the largest difference of its state from rank 0's; rank 0 writes them to
``OUT_DIR/MODE-MODEL[-plain]/updates.json`` beside ``model.pt``.
"""

import atexit
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchvision

import bno_hvd as bno
from bno_hvd.allocation import Strategy, make_strategy
from bno_hvd.data.models import InputAdapter
from bno_hvd.library.balancer import Balancer
from bno_hvd.library.catchup import CatchUp
from bno_hvd.processes.collectives import optimizer_step, submit_gradients

UPDATES, GLOBAL, SEED, SAMPLES = 12, 16, 5, 512
SPLITS = {  # every 2 updates; a rank at 1 in each; rank 3 sits out (0) in the second and third
    "ddp": [[1, 7, 3, 5], [6, 1, 4, 5], [9, 2, 4, 1], [1, 1, 5, 9], [4, 1, 3, 8], [2, 5, 8, 1]],
    "float16": [[1, 7, 3, 5], [6, 1, 9, 0], [8, 4, 4, 0], [1, 1, 5, 9], [4, 1, 3, 8], [2, 5, 8, 1]],
}
DEVICE = torch.device("cpu" if "--device=cpu" in sys.argv else "cuda:0")
AMP = ("cuda", torch.float16) if DEVICE.type == "cuda" else ("cpu", torch.bfloat16)


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


def dataset(dtype):
    gen = torch.Generator().manual_seed(SEED)
    images = torch.rand(SAMPLES, 1, 28, 28, generator=gen, dtype=dtype)
    return torch.utils.data.TensorDataset(images, torch.randint(0, 10, (SAMPLES,), generator=gen))


def strategy_for(mode, size):
    return make_strategy("fixed", 1, GLOBAL, batch_sizes=[GLOBAL]) if size == 1 else Splits(SPLITS[mode])


class Reports:
    """After each update: every rank's (computed, scale, difference from rank 0's state) -> rank 0's table."""

    def __init__(self, comm):
        self.comm, self.rows = comm, []

    def add(self, sizes, computed, model, scaler):
        state = torch.cat([t.detach().double().flatten() for t in model.state_dict().values()])
        ref = state.clone()
        dist.broadcast(ref, src=0)  # a CUDA tensor over Gloo
        scale = scaler.get_scale() if scaler is not None else None
        everyone = self.comm.gather((computed, scale, float((state - ref).abs().max())), root=0)
        if everyone is not None:
            rows = {"sizes": list(sizes), "computed": [c for c, _, _ in everyone]}
            rows.update(scales=[s for _, s, _ in everyone], diff=[d for _, _, d in everyone])
            self.rows.append(rows)


def run_ddp(model_name, plain, comm):
    updates = UPDATES // 3 if model_name == "resnet18" else UPDATES  # 2 splits: resnet18 is the costly one
    data = dataset(torch.float64)
    bal = bno.Balancer.for_world(data, 4, strategy_for("ddp", dist.get_world_size()), seed=SEED, rebalance_every=2)
    loader = bno.DataLoader(data, sampler=bal)
    model = model_named(model_name).to(DEVICE)
    if not plain:
        model = bno.exact(model, bal)
    model = bno.DistributedDataParallel(model, balancer=bal, device_ids=[0] if DEVICE.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    reports, done = Reports(comm), 0
    while done < updates:
        for images, labels in loader:
            sizes = bal.current_step.batch_sizes
            optimizer.zero_grad()
            F.cross_entropy(model(images.to(DEVICE)), labels.to(DEVICE)).backward()
            optimizer.step()
            reports.add(sizes, True, model, None)
            done += 1
            if done == updates:
                break
    return model.module, reports


def run_float16(world, model_name):
    data = dataset(torch.float32)
    bal = Balancer(
        world.control_comm, strategy_for("float16", world.size), len(data), seed=SEED, rebalance_every=2, sit_out=True
    )
    loader = bal.loader(data)
    model = bno.exact(model_named(model_name).to(DEVICE), bal, process_sets=world.sit_out_sets)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    engine = world.hvd  # the torch engine's collectives
    engine.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = engine.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=engine.Sum)
    scaler = torch.amp.GradScaler(AMP[0], init_scale=2.0**8, growth_interval=2)
    sit_out = CatchUp(world, model, optimizer, scaler)
    reports = Reports(world.control_comm.Dup())
    for batch in bal.batches(loader, UPDATES):
        sit_out.begin(bal.batch_sizes)
        step = bal.start_step(batch)
        if step.size:
            optimizer.zero_grad()
            images, labels = (t.to(DEVICE) for t in batch.data)
            with torch.autocast(AMP[0], dtype=AMP[1]):
                loss = F.cross_entropy(model(images), labels) * step.weight
            scaler.scale(loss).backward()
            submit_gradients(optimizer)
            optimizer_step(optimizer, scaler)
        bal.end_compute()
        bal.end_step()
        reports.add(step.batch_sizes, step.size > 0, model, scaler)
    sit_out.catch_up()
    reports.add([1] * world.size, True, model, scaler)  # after the last catch-up: every rank alike
    return model, reports


def main():
    out, *cases = [a for a in sys.argv[1:] if a != "--device=cpu"]
    if DEVICE.type == "cuda":
        torch.cuda.set_device(DEVICE)
    torch.set_num_threads(1)
    if all(c.startswith("ddp:") for c in cases):
        from bno_hvd.processes.torchcomm import TorchComm
        from bno_hvd.processes.torchenv import finish_process_group

        dist.init_process_group("gloo")  # several ranks on one GPU: Gloo (NCCL takes one rank per GPU)
        atexit.register(finish_process_group)
        world, comm = None, TorchComm()
    else:
        from bno_hvd.processes.world import init_world

        world = init_world("gloo", DEVICE.type, engine="torch")
    for case in cases:
        mode, model_name, *plain = case.split(":")
        torch.set_default_dtype(torch.float64 if mode == "ddp" else torch.float32)
        torch.manual_seed(SEED)
        if mode == "ddp":
            model, reports = run_ddp(model_name, plain == ["plain"], comm)
        else:
            model, reports = run_float16(world, model_name)
        if dist.get_rank() == 0:
            where = os.path.join(out, case.replace(":", "-"))
            os.makedirs(where)
            torch.save({k: v.cpu() for k, v in model.state_dict().items()}, os.path.join(where, "model.pt"))
            with open(os.path.join(where, "updates.json"), "w") as fh:
                json.dump(reports.rows, fh)


if __name__ == "__main__":
    main()
