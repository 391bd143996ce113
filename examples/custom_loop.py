"""bno-hvd inside your own Horovod loop. Run: horovodrun -np 4 --mpi python examples/custom_loop.py"""

import horovod.torch as hvd
import torch
import torch.nn.functional as F
import torchvision
from mpi4py import MPI
from torchvision import transforms as T

from bno_hvd import Balancer, MetricsMonitor, build_model, make_strategy
from bno_hvd.data import torchvision_root

hvd.init()
torch.set_num_threads(1)
augment = T.Compose([T.RandomCrop(28, padding=2), T.ToTensor(), T.Normalize((0.286,), (0.353,))])
data = torchvision.datasets.FashionMNIST(torchvision_root(), train=True, transform=augment, download=False)
model = build_model("cnn")
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Sum)
monitor = MetricsMonitor(MPI.COMM_WORLD.Dup()).start()  # memory + latency on a thread
bal = Balancer(MPI.COMM_WORLD.Dup(), make_strategy("balanced", hvd.size(), 32), len(data), monitor=monitor)
loader = bal.loader(data, num_workers=2, persistent_workers=True)  # this rank's slices
for batch in bal.batches(loader, updates=100):  # epoch after epoch
    step = bal.start_step(batch)  # weight = n_rank / sum(n) of this batch's update
    x, y = batch.data
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    (loss * step.weight).backward()
    bal.end_compute()
    opt.step()  # Horovod allreduce, op=Sum
    bal.end_step()  # measure; rebalance every 10 updates
monitor.stop()
if hvd.rank() == 0:
    print(f"final batch sizes {bal.batch_sizes} loss {loss.item():.4f}", flush=True)  # one write
