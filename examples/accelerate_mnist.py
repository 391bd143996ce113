"""A plain Hugging Face Accelerate training script, ported to bno-hvd: a small CNN on Fashion-MNIST.

Written in the shape of Accelerate's own examples (``nlp_example.py``, ``cv_example.py``), not
copied from them: an ``Accelerator``, a DataLoader per split, ``accelerator.prepare(model, optimizer,
train_loader, test_loader)``, a loop with ``accelerator.backward(loss)``, the test split gathered
with ``accelerator.gather_for_metrics``. Every line of the port ends in a "# bno-hvd:" comment that
says what the plain line was ("was <line>") or that it is new ("added"); putting those lines back
gives the plain script, which tests/library/test_accelerate.py builds and runs. Lines marked
"# offline" read Fashion-MNIST from local files (nothing is downloaded). On CPUs (Gloo):

    torchrun --nproc-per-node 4 examples/accelerate_mnist.py --cpu --epochs 1

and on GPUs ``accelerate launch --multi_gpu --num_processes 4 examples/accelerate_mnist.py``.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

import bno_hvd as bno  # bno-hvd: added
from bno_hvd.data import torchvision_root  # offline


def parse_args():
    parser = argparse.ArgumentParser(description="Train a small CNN on Fashion-MNIST with Accelerate")
    parser.add_argument("--batch-size", type=int, default=64, help="training samples per process and step [64]")
    parser.add_argument("--test-batch-size", type=int, default=1000, help="test samples per process and forward")
    parser.add_argument("--epochs", type=int, default=10, help="passes over the training set [10]")
    parser.add_argument("--lr", type=float, default=0.01, help="one process's learning rate, times the processes")
    parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum [0.5]")
    parser.add_argument("--seed", type=int, default=42, help="seeds the initial weights and the shuffle [42]")
    parser.add_argument("--log-interval", type=int, default=10, help="steps between two progress lines [10]")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU (Gloo) even where GPUs are")
    parser.add_argument("--data-dir", help="a folder holding FashionMNIST/raw/ [the project's data folder]")
    parser.add_argument("--strategy", default="balanced", help="how bno-hvd splits each global batch")  # bno-hvd: added
    parser.add_argument("--rebalance-every", type=int, default=10, help="updates between two splits")  # bno-hvd: added
    return parser.parse_args()


class Net(nn.Module):
    """Two 5x5 convolutions, each followed by 2x2 max pooling, then two linear layers. BatchNorm
    follows the first convolution, a channel dropout the second, a plain dropout the hidden layer."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 10, kernel_size=5),  # 28x28 -> 10 x 24x24
            nn.BatchNorm2d(10),
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


def train(epoch, model, optimizer, train_loader, accelerator: Accelerator, log_interval):
    """One epoch over this process's part of the training set."""
    model.train()
    seen = 0
    for step, (images, labels) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(images), labels)
        accelerator.backward(loss)  # DDP averages the gradients over the processes as they are computed
        optimizer.step()
        seen += len(images)
        if step % log_interval == 0:
            print(
                f"process {accelerator.process_index}, epoch {epoch}, step {step}/{len(train_loader)}: "
                f"{seen} samples, loss {loss.item():.4f}"
            )


def test(model, test_loader, accelerator: Accelerator):
    """Mean loss and accuracy on the test split: each process scores its part, gathered for the metrics."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, samples
    with torch.no_grad():
        for images, labels in test_loader:
            log_probs, labels = accelerator.gather_for_metrics((model(images), labels))
            totals[0] += F.nll_loss(log_probs, labels, reduction="sum").item()
            totals[1] += (log_probs.argmax(dim=1) == labels).sum().item()
            totals[2] += len(labels)
    loss, accuracy = (totals[:2] / totals[2]).tolist()
    accelerator.print(f"test set: mean loss {loss:.4f}, accuracy {100 * accuracy:.2f}%", flush=True)


def main():
    args = parse_args()
    accelerator = bno.accelerate.Accelerator(cpu=args.cpu)  # bno-hvd: was accelerator = Accelerator(cpu=args.cpu)
    torch.manual_seed(args.seed)  # the same initial weights in every process (DDP also sends process 0's)
    torch.set_num_threads(1)  # one thread per process: the processes of a host share its cores

    data_dir = args.data_dir or torchvision_root()  # offline
    to_input = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))])
    train_set = datasets.FashionMNIST(data_dir, train=True, transform=to_input, download=False)  # offline
    test_set = datasets.FashionMNIST(data_dir, train=False, transform=to_input, download=False)  # offline

    # Accelerate gives each process its part of every split
    balance = {"seed": args.seed, "rebalance_every": args.rebalance_every}  # bno-hvd: added
    train_sampler = bno.Balancer.for_world(train_set, args.batch_size, args.strategy, **balance)  # bno-hvd: added
    train_loader = bno.DataLoader(train_set, sampler=train_sampler)  # bno-hvd: was train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=args.test_batch_size)

    model = bno.exact(Net(), train_sampler)  # bno-hvd: was model = Net()
    # a step of N processes takes N times one process's batch, so it takes N times the learning rate
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * accelerator.num_processes, momentum=args.momentum)
    model, optimizer, train_loader, test_loader = accelerator.prepare(model, optimizer, train_loader, test_loader)

    for epoch in range(1, args.epochs + 1):
        train(epoch, model, optimizer, train_loader, accelerator, args.log_interval)
        test(model, test_loader, accelerator)
    accelerator.end_training()


if __name__ == "__main__":
    main()
