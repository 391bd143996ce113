"""The DDP drop-in's hooks on a model's parameters and on every optimizer's step live as long as
its DDP model: ``bno.elastic`` builds a new one on the same parameters in each generation, and the
hooks of the earlier ones, each a no-op by then, would otherwise stay and run on every step."""

import re

import pytest
from support.jobs import assert_ok, torchrun

pytestmark = pytest.mark.mpi

SCRIPT = """
import gc
import sys
import torch, torch.distributed as dist
import torch.optim.optimizer as optim
import bno_hvd as bno

dist.init_process_group("gloo")
data = torch.utils.data.TensorDataset(torch.randn(48, 3), torch.randn(48, 1))
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
counts = []
for generation in range(3):  # as bno.elastic's generations do: a new balancer and DDP model each time
    sampler = bno.Balancer.for_world(data, 6, "random", seed=generation, sit_out=True)
    ddp = bno.DistributedDataParallel(model, balancer=sampler)
    for x, y in bno.DataLoader(data, sampler=sampler):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
    counts.append((len(model.weight._backward_hooks), len(optim._global_optimizer_pre_hooks),
                   len(optim._global_optimizer_post_hooks), sampler.update))
    del ddp, sampler
    gc.collect()
sys.stdout.write(f"rank {dist.get_rank()}: hooks per generation {counts}\\n")  # one write: the ranks share a pipe
sys.stdout.flush()
dist.destroy_process_group()
"""


def test_the_hooks_of_a_ddp_model_go_with_it(tmp_path):
    for counts in each_ranks_list(tmp_path, SCRIPT, "hooks per generation "):
        assert counts[0][3] == 4 and len(set(counts)) == 1, counts  # trained each time; no hook left over
        assert counts[0][:3] == (1, 1, 1), counts  # one of each: the step's ends, sit-out's, its last step


BOUNDARY = """
import gc
import sys
import torch, torch.distributed as dist
import bno_hvd as bno

dist.init_process_group("gloo")
data = torch.utils.data.TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
sampler = bno.Balancer.for_world(data, 4, "random", seed=3, sit_out=False)
events = []
sampler.before_step = lambda: events.append(("start", sampler.update, sampler.current_step is None))
ddp = bno.DistributedDataParallel(model, balancer=sampler)
for epoch in range(2):
    for x, y in bno.DataLoader(data, sampler=sampler):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
    events.append(("evaluate", sampler.update, sampler.current_step is None))
sys.stdout.write(f"rank {dist.get_rank()}: {events}\\n")
sys.stdout.flush()
del ddp, sampler  # before the group: a DDP model freed after it, in the finalization, aborts the rank (Gloo)
gc.collect()
dist.destroy_process_group()
"""


def test_before_step_runs_as_each_update_starts_and_never_after_an_epochs_last(tmp_path):
    """``Balancer.before_step``, bno.elastic's update boundary: called once per update as its batch
    is handed out, with the last update finished; none after an epoch's last update, so a newer
    generation found there leaves after the script's evaluation, and after the job's last, never."""
    for events in each_ranks_list(tmp_path, BOUNDARY):
        expected = [("start", u, True) for u in range(5)] + [("evaluate", 5, True)]  # 40 samples, 8 an update
        expected += [("start", u, True) for u in range(5, 10)] + [("evaluate", 10, True)]
        assert events == expected, events


def each_ranks_list(tmp_path, source: str, label: str = "") -> list:
    """Run ``source`` on 2 ranks under torchrun; the list each rank printed after ``rank R: label``."""
    script = tmp_path / "script.py"
    script.write_text(source)
    proc = torchrun(2, [str(script)], timeout=120)
    assert_ok(proc)
    lists = []
    for rank in range(2):
        # found anywhere: unbuffered (PYTHONUNBUFFERED), the other rank's print may land mid-line
        found = re.search(rf"rank {rank}: {label}(\[[^\[\]]*\])", proc.stdout)
        assert found, proc.stdout
        lists.append(eval(found.group(1)))  # noqa: S307 - our own script's list of tuples
    return lists
