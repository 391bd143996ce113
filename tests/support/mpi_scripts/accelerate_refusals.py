"""What a balanced Accelerate script cannot do exactly, refused in one line on every process.

``python accelerate_refusals.py CASE`` under torchrun (2 processes, CPU): the refusal ends the script
as it would a user's (one ``bno-hvd: error:`` line, exit code 2 on every process). The cases:

- ``accumulate``: ``Accelerator(gradient_accumulation_steps=2)``;
- ``apart``: the model prepared for training before, and apart from, the balancer's loader;
- ``comm-hook``: ``DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)``.
"""

import sys

import torch
from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs
from torch.utils.data import TensorDataset

import bno_hvd as bno


def main(case: str) -> None:
    options = {"cpu": True}
    if case == "accumulate":
        options["gradient_accumulation_steps"] = 2
    if case == "comm-hook":
        options["kwargs_handlers"] = [DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)]
    accelerator = bno.accelerate.Accelerator(**options)
    data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    sampler = bno.Balancer.for_world(data, 4, "random", seed=1)
    loader = bno.DataLoader(data, sampler=sampler)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if case == "apart":
        model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.prepare(model, optimizer, loader)
    print(f"{case} was not refused", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
