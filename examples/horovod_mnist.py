"""A plain Horovod training script, ported to bno-hvd: a small CNN on Fashion-MNIST.

Written in the shape of Horovod's PyTorch MNIST example, not copied from it: command-line options,
a CNN with two dropouts, a train and a test function, the test split cut by DistributedSampler
and its metrics averaged over the ranks, the learning rate times the number of ranks, rank 0's
parameters and optimizer state broadcast to all. Every line of the port ends in a "# bno-hvd:"
comment that says what the plain Horovod line was ("was <line>") or that it is new ("added");
putting those lines back gives the plain script, which tests/library/test_horovod_port.py builds
and runs. Lines marked "# offline" read Fashion-MNIST from local files (nothing is downloaded).
The port's exact(model, sampler) draws each dropout mask per global sample and gives BatchNorm
layers (this Net has none) the global batch's statistics: uneven ranks then train as one process.
Trains on the CPU:

    source launch/mpi-env
    horovodrun -np 4 python examples/horovod_mnist.py --epochs 1
"""

import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms

import bno_hvd as bno  # bno-hvd: added
from bno_hvd.data import torchvision_root  # offline


def parse_args():
    parser = argparse.ArgumentParser(description="Train a small CNN on Fashion-MNIST with Horovod")
    parser.add_argument("--batch-size", type=int, default=64, help="training samples per rank and step [64]")
    parser.add_argument("--test-batch-size", type=int, default=1000, help="test samples per rank and forward [1000]")
    parser.add_argument("--epochs", type=int, default=10, help="passes over the training set [10]")
    parser.add_argument("--lr", type=float, default=0.01, help="one rank's learning rate, times the ranks [0.01]")
    parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum [0.5]")
    parser.add_argument("--seed", type=int, default=42, help="seeds the initial weights [42]")
    parser.add_argument("--log-interval", type=int, default=10, help="steps between two progress lines [10]")
    parser.add_argument("--data-dir", help="a folder holding FashionMNIST/raw/ [the project's data folder]")
    parser.add_argument("--strategy", default="balanced", help="how bno-hvd splits each global batch")  # bno-hvd: added
    return parser.parse_args()


class Net(nn.Module):
    """Two 5x5 convolutions, each followed by 2x2 max pooling, then two linear layers. A channel
    dropout acts on the second convolution's output, a plain dropout before the last layer."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 10, kernel_size=5),  # 28x28 -> 10 x 24x24
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Conv2d(10, 20, kernel_size=5),  # 12x12 -> 20 x 8x8
            nn.Dropout2d(0.5),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Flatten(),  # 20 x 4x4 = 320
        )
        self.hidden = nn.Linear(320, 50)
        self.classes = nn.Linear(50, 10)

    def forward(self, images):
        hidden = F.relu(self.hidden(self.features(images)))
        hidden = F.dropout(hidden, p=0.5, training=self.training)
        return F.log_softmax(self.classes(hidden), dim=1)


def train(epoch, model, optimizer, train_loader, train_sampler, log_interval):
    """One epoch over this rank's part of the training set."""
    model.train()
    train_sampler.set_epoch(epoch)  # another shuffle in every epoch
    seen = 0
    for step, (images, labels) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(images), labels)
        loss.backward()
        optimizer.step()  # the gradients are combined over the ranks before the update
        seen += len(images)
        if step % log_interval == 0:
            print(
                f"rank {hvd.rank()}, epoch {epoch}, step {step}/{len(train_loader)}: "
                f"{seen}/{len(train_sampler)} of this rank's samples, loss {loss.item():.4f}"
            )


def metric_average(value, name):
    """The mean of a number over the ranks (an allreduce averages by default)."""
    return hvd.allreduce(torch.tensor(value), name=name).item()


def test(model, test_loader, test_sampler):
    """Mean loss and accuracy on the test split: each rank scores its part, the ranks average."""
    model.eval()
    loss_sum, correct = 0.0, 0.0
    with torch.no_grad():
        for images, labels in test_loader:
            log_probs = model(images)
            loss_sum += F.nll_loss(log_probs, labels, reduction="sum").item()
            correct += (log_probs.argmax(dim=1) == labels).sum().item()
    loss = metric_average(loss_sum / len(test_sampler), "test_loss")
    accuracy = metric_average(correct / len(test_sampler), "test_accuracy")
    if hvd.rank() == 0:
        print(f"test set: mean loss {loss:.4f}, accuracy {100 * accuracy:.2f}%", flush=True)


def main():
    args = parse_args()
    bno.init()  # bno-hvd: was hvd.init()
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    torch.set_num_threads(1)  # one thread per rank: the ranks of a host share its cores

    data_dir = args.data_dir or torchvision_root()  # offline
    to_input = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))])
    train_set = datasets.FashionMNIST(data_dir, train=True, transform=to_input, download=False)  # offline
    test_set = datasets.FashionMNIST(data_dir, train=False, transform=to_input, download=False)  # offline

    # each rank reads its own part of the training set, and of the test split
    train_sampler = bno.Balancer.for_world(train_set, args.batch_size, args.strategy, seed=args.seed)  # bno-hvd: was train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = bno.DataLoader(train_set, sampler=train_sampler)  # bno-hvd: was train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = DataLoader(test_set, batch_size=args.test_batch_size, sampler=test_sampler)

    model = bno.exact(Net(), train_sampler)  # bno-hvd: was model = Net()
    # a step of N ranks takes N times one rank's batch, so it takes N times the learning rate
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    # every rank starts from rank 0's weights and optimizer state
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = bno.DistributedOptimizer(optimizer, model.named_parameters(), balancer=train_sampler)  # bno-hvd: was optimizer = hvd.DistributedOptimizer(optimizer, model.named_parameters())

    for epoch in range(1, args.epochs + 1):
        train(epoch, model, optimizer, train_loader, train_sampler, args.log_interval)
        test(model, test_loader, test_sampler)


if __name__ == "__main__":
    main()
