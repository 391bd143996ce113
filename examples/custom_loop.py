"""bno-hvd inside your own Horovod loop. Run: horovodrun -np 4 --mpi python examples/custom_loop.py"""

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from mpi4py import MPI

from bno_hvd import Balancer, MetricsMonitor, make_strategy
from bno_hvd.data import load_dataset
from bno_hvd.models import build_model

hvd.init()
torch.set_num_threads(1)
x, y = load_dataset("fashion-mnist", "train").tensors
model = build_model("cnn")
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Sum)
monitor = MetricsMonitor(MPI.COMM_WORLD.Dup()).start()  # memory + latency thread
bal = Balancer(
    MPI.COMM_WORLD.Dup(), make_strategy("balanced", hvd.size(), 32), len(y), rebalance_every=10, monitor=monitor
)
for _ in range(100):
    step = bal.start_step()  # this rank's slice and weight
    opt.zero_grad()
    loss = F.cross_entropy(model(x[step.indices]), y[step.indices])
    (loss * step.weight).backward()  # weight = n_rank / sum(n)
    bal.end_compute()
    opt.step()  # Horovod allreduce, op=Sum
    bal.end_step()  # measure; rebalance every 10
monitor.stop()
if hvd.rank() == 0:
    print(f"final batch sizes {bal.batch_sizes} loss {loss.item():.4f}", flush=True)  # one write
