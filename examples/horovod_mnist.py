"""Horovod's PyTorch MNIST example, ported to bno-hvd: uneven per-rank batches through a DataLoader.

Written in the shape of Horovod's examples/pytorch/pytorch_mnist.py (argparse, Net, train_epoch,
test with DistributedSampler, metric_average). Every line that differs from the plain Horovod
version ends in a "bno-hvd:" comment; README lists them. Data: Fashion-MNIST from local files
(nothing is downloaded), read by torchvision.

    horovodrun -np 4 --mpi python examples/horovod_mnist.py --epochs 1
"""

import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from mpi4py import MPI  # bno-hvd: the control plane talks MPI
from torchvision import datasets, transforms

from bno_hvd import Balancer, make_strategy  # bno-hvd
from bno_hvd.data import torchvision_root  # bno-hvd: offline data (torchvision's layout)

parser = argparse.ArgumentParser(description="PyTorch MNIST Example, bno-hvd")
parser.add_argument("--batch-size", type=int, default=64, help="input batch size per rank (default: 64)")
parser.add_argument("--test-batch-size", type=int, default=1000, help="input batch size for testing")
parser.add_argument("--epochs", type=int, default=2, help="number of epochs to train (default: 2)")
parser.add_argument("--max-batches", type=int, default=0, help="stop an epoch after this many batches (0: all)")
parser.add_argument("--lr", type=float, default=0.01, help="learning rate (default: 0.01)")
parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum (default: 0.5)")
parser.add_argument("--seed", type=int, default=42, help="random seed (default: 42)")
parser.add_argument("--log-interval", type=int, default=10, help="batches between log lines")
parser.add_argument("--num-workers", type=int, default=1, help="DataLoader workers per rank")
parser.add_argument("--strategy", default="balanced", help="bno-hvd allocation strategy")  # bno-hvd


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def train(args):
    def train_epoch(epoch):
        model.train()
        for batch_idx, batch in enumerate(train_loader):  # bno-hvd: batches carry their update
            step = balancer.start_step(batch)  # bno-hvd: checks the batch, gives its loss weight
            data, target = batch.data  # bno-hvd
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            (loss * step.weight).backward()  # bno-hvd: weight = this rank's share of the global batch
            balancer.end_compute()  # bno-hvd: measure this rank's compute
            optimizer.step()
            balancer.end_step()  # bno-hvd: measure; rebalance every 10 updates
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                sizes = ",".join(map(str, step.batch_sizes))  # bno-hvd: this update's allocation
                print(f"Train Epoch: {epoch} [update {step.update}, batch sizes {sizes}]\tLoss: {loss.item():.6f}")
            if batch_idx + 1 == args.max_batches:
                break

    def metric_average(val, name):
        return hvd.allreduce(torch.tensor(val), name=name).item()

    def test():
        model.eval()
        test_loss, test_accuracy = 0.0, 0.0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                pred = output.argmax(1, keepdim=True)
                test_accuracy += pred.eq(target.view_as(pred)).float().sum().item()
        test_loss /= len(test_sampler)
        test_accuracy /= len(test_sampler)
        test_loss = metric_average(test_loss, "avg_loss")
        test_accuracy = metric_average(test_accuracy, "avg_accuracy")
        if hvd.rank() == 0:
            print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * test_accuracy:.2f}%\n", flush=True)

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    kwargs = {"num_workers": args.num_workers}
    normalize = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))])
    data_dir = torchvision_root()  # bno-hvd: offline data
    train_dataset = datasets.FashionMNIST(data_dir, train=True, download=False, transform=normalize)
    strategy = make_strategy(args.strategy, hvd.size(), args.batch_size)  # bno-hvd: not DistributedSampler
    balancer = Balancer(MPI.COMM_WORLD.Dup(), strategy, len(train_dataset), seed=args.seed)  # bno-hvd
    train_loader = balancer.loader(train_dataset, **kwargs)  # bno-hvd: batch size and order: the balancer's

    test_dataset = datasets.FashionMNIST(data_dir, train=False, download=False, transform=normalize)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank()
    )
    test_loader = torch.utils.data.DataLoader(
        test_dataset, batch_size=args.test_batch_size, sampler=test_sampler, **kwargs
    )

    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    named = model.named_parameters()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=named, op=hvd.Sum)  # bno-hvd: Sum, not Average
    for epoch in range(1, args.epochs + 1):
        train_epoch(epoch)
        test()


if __name__ == "__main__":
    train(parser.parse_args())
