"""examples/ddp_mnist.py under elastic membership: workers may die, leave and join while it trains.

The same DDP script with its training in a function of ``@bno.elastic.run`` (one call per
generation of workers: the Balancer, the loaders and the DDP model are built for the ranks there
are), the plain model and its optimizer kept in a ``bno.elastic.State`` across generations. As in
examples/ddp_mnist.py, every line of the port ends in "# bno-hvd:" ("was <the plain DDP line>" or
"added"): 19 lines, ddp_mnist.py's 8 (2 of them changed: the balance and the model lines) and 11
for elastic membership; every other line is a line of ddp_mnist.py or of the plain script, some
moved from main() into fit() (tests/training/test_ddp_elastic.py checks both). Launched by the agent, on CPUs (Gloo):

    bno-hvd elastic -n 4 --max-ranks 6 -- python examples/ddp_elastic.py --epochs 1 --log-dir runs/ddp-elastic
    kill -KILL $WORKER_PID; kill -TERM $WORKER_PID; kill -USR1 $AGENT_PID    # die, leave, one more joins
    bno-hvd ledger check runs/ddp-elastic                                      # no sample lost or repeated
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms

import bno_hvd as bno  # bno-hvd: added
from bno_hvd.data import torchvision_root  # offline


def parse_args():
    parser = argparse.ArgumentParser(description="Train a small CNN on Fashion-MNIST with DDP under torchrun")
    parser.add_argument("--batch-size", type=int, default=64, help="training samples per rank and step [64]")
    parser.add_argument("--test-batch-size", type=int, default=1000, help="test samples per rank and forward [1000]")
    parser.add_argument("--epochs", type=int, default=10, help="passes over the training set [10]")
    parser.add_argument("--lr", type=float, default=0.01, help="one rank's learning rate, times the ranks [0.01]")
    parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum [0.5]")
    parser.add_argument("--seed", type=int, default=42, help="seeds the initial weights and the shuffle [42]")
    parser.add_argument("--log-interval", type=int, default=10, help="steps between two progress lines [10]")
    parser.add_argument("--data-dir", help="a folder holding FashionMNIST/raw/ [the project's data folder]")
    parser.add_argument("--strategy", default="balanced", help="how bno-hvd splits each global batch")  # bno-hvd: added
    parser.add_argument("--rebalance-every", type=int, default=10, help="updates between two splits")  # bno-hvd: added
    parser.add_argument("--global-batch", type=int, default=256, help="samples per update, whatever the ranks")  # bno-hvd: added
    parser.add_argument("--log-dir", help="where the sample ledger goes (bno-hvd ledger check)")  # bno-hvd: added
    parser.add_argument("--elastic-timeout", type=float, default=30.0, help="seconds a collective may take")  # bno-hvd: added
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


def setup():
    """Join the job torchrun started (NCCL between GPUs, Gloo on CPUs); this process's device."""
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    return device


def train(epoch, model, optimizer, train_loader, train_sampler, device, log_interval):
    """One epoch over this rank's part of the training set."""
    model.train()
    train_sampler.set_epoch(epoch)  # another shuffle in every epoch
    seen = 0
    for step, (images, labels) in enumerate(train_loader):
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(images), labels)
        loss.backward()  # DDP averages the gradients over the ranks as they are computed
        optimizer.step()
        seen += len(images)
        if step % log_interval == 0:
            print(
                f"rank {dist.get_rank()}, epoch {epoch}, step {step}/{len(train_loader)}: "
                f"{seen}/{len(train_sampler)} of this rank's samples, loss {loss.item():.4f}"
            )


def test(model, test_loader, device):
    """Mean loss and accuracy on the test split: each rank scores its part, the ranks sum."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, samples
    with torch.no_grad():
        for images, labels in test_loader:
            images, labels = images.to(device), labels.to(device)
            log_probs = model(images)
            totals[0] += F.nll_loss(log_probs, labels, reduction="sum").item()
            totals[1] += (log_probs.argmax(dim=1) == labels).sum().item()
            totals[2] += len(labels)
    dist.all_reduce(totals)
    if dist.get_rank() == 0:
        loss, accuracy = (totals[:2] / totals[2]).tolist()
        print(f"test set: mean loss {loss:.4f}, accuracy {100 * accuracy:.2f}%", flush=True)


def main():
    args = parse_args()
    device = torch.device("cpu")  # bno-hvd: was device = setup()
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also sends rank 0's)
    torch.set_num_threads(1)  # one thread per rank: the ranks of a host share its cores

    data_dir = args.data_dir or torchvision_root()  # offline
    to_input = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))])
    train_set = datasets.FashionMNIST(data_dir, train=True, transform=to_input, download=False)  # offline
    test_set = datasets.FashionMNIST(data_dir, train=False, transform=to_input, download=False)  # offline

    model = Net().to(device)
    # a step of N ranks takes N times one rank's batch, so it takes N times the learning rate
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * args.global_batch / args.batch_size, momentum=args.momentum)  # bno-hvd: was optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * dist.get_world_size(), momentum=args.momentum)
    state = bno.elastic.State(model, optimizer, log_dir=args.log_dir, timeout=args.elastic_timeout)  # bno-hvd: added
    fit(state, args, train_set, test_set, device)  # bno-hvd: added
    dist.destroy_process_group()


@bno.elastic.run  # bno-hvd: added
def fit(state, args, train_set, test_set, device):  # bno-hvd: added
    # each rank reads its own part of the training set, and of the test split
    balance = {"seed": args.seed, "rebalance_every": args.rebalance_every, "global_batch": args.global_batch, "sit_out": False}  # bno-hvd: added
    train_sampler = bno.Balancer.for_world(train_set, args.batch_size, args.strategy, **balance)  # bno-hvd: was train_sampler = DistributedSampler(train_set, seed=args.seed)
    train_loader = bno.DataLoader(train_set, sampler=train_sampler)  # bno-hvd: was train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = DistributedSampler(test_set, shuffle=False)
    test_loader = DataLoader(test_set, batch_size=args.test_batch_size, sampler=test_sampler)

    model = bno.exact_dropout(state.model, train_sampler)  # bno-hvd: was model = Net().to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    model = bno.DistributedDataParallel(model, balancer=train_sampler, device_ids=device_ids)  # bno-hvd: was model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)

    for epoch in state.epochs(train_sampler, args.epochs):  # bno-hvd: was for epoch in range(1, args.epochs + 1):
        train(epoch, model, state.optimizer, train_loader, train_sampler, device, args.log_interval)  # bno-hvd: was train(epoch, model, optimizer, train_loader, train_sampler, device, args.log_interval)
        test(model, test_loader, device)


if __name__ == "__main__":
    main()
