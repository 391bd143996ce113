"""A plain PyTorch Lightning script on 4 CPU ranks, ported to bno-hvd: a small CNN on Fashion-MNIST.

Written in the shape of Lightning's own examples: a LightningModule with its ``training_step``,
``test_step`` and ``configure_optimizers``, a training ``DataLoader(batch_size=B, shuffle=True)``
(Lightning gives each rank its part), and a Trainer with a DDP strategy. The model has dropout and
BatchNorm. Every line of the port ends in a "# bno-hvd:" comment that says what the plain line was
("was <line>") or that it is new ("added"); putting those lines back gives the plain script, which
tests/library/test_lightning_port.py builds and runs. Lines marked "# offline" read Fashion-MNIST
from local files (nothing is downloaded). Lightning starts the ranks itself, or torchrun does:

    python examples/lightning_mnist.py --epochs 1
    torchrun --nproc-per-node 4 examples/lightning_mnist.py --epochs 1
"""

import argparse

import lightning as L
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.optim import SGD
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

import bno_hvd as bno  # bno-hvd: added
from bno_hvd.data import torchvision_root  # offline


def parse_args():
    parser = argparse.ArgumentParser(description="Train a small CNN on Fashion-MNIST with Lightning's DDP")
    parser.add_argument("--batch-size", type=int, default=64, help="training samples per rank and step [64]")
    parser.add_argument("--devices", type=int, default=4, help="ranks on this machine [4]")
    parser.add_argument("--epochs", type=int, default=2, help="passes over the training set [2]")
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after this many updates [-1: none]")
    parser.add_argument("--sync-batchnorm", action="store_true", help="BatchNorm over every rank's batch")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate [0.05]")
    parser.add_argument("--seed", type=int, default=42, help="seeds the initial weights and the shuffle [42]")
    parser.add_argument("--log-dir", default="lightning_logs", help="the CSV logger's folder [lightning_logs]")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="a checkpoint every N updates [0: none]")
    parser.add_argument("--resume", help="a checkpoint to resume from (Trainer.fit's ckpt_path)")
    parser.add_argument("--data-dir", help="a folder holding FashionMNIST/raw/ [the project's data folder]")
    parser.add_argument("--strategy", default="balanced", help="how bno-hvd splits each global batch")  # bno-hvd: added
    parser.add_argument("--rebalance-every", type=int, default=10, help="updates between two splits")  # bno-hvd: added
    parser.add_argument("--local-batchnorm", action="store_true", dest="bn", help="BatchNorm per rank")  # bno-hvd: added
    return parser.parse_args()


class Net(nn.Module):
    """Two 5x5 convolutions with BatchNorm and 2x2 max pooling, then two linear layers. A channel
    dropout acts on the second convolution's output, a plain dropout before the last layer."""

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


class FashionClassifier(L.LightningModule):
    """``Net`` trained by SGD on the negative log-likelihood; scored on the test split."""

    def __init__(self, data_dir, batch_size, lr):
        super().__init__()
        self.net, self.data_dir, self.batch_size, self.lr = Net(), data_dir, batch_size, lr
        self.to_input = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))])

    def train_dataloader(self):
        train_set = datasets.FashionMNIST(self.data_dir, train=True, transform=self.to_input)  # offline
        return DataLoader(train_set, batch_size=self.batch_size, shuffle=True)

    def test_dataloader(self):
        test_set = datasets.FashionMNIST(self.data_dir, train=False, transform=self.to_input)  # offline
        return DataLoader(test_set, batch_size=1000)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.nll_loss(self.net(images), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def test_step(self, batch, batch_idx):
        images, labels = batch
        log_probs = self.net(images)
        self.log("test_loss", F.nll_loss(log_probs, labels), sync_dist=True)
        self.log("test_accuracy", (log_probs.argmax(dim=1) == labels).double().mean(), sync_dist=True)

    def configure_optimizers(self):
        return SGD(self.parameters(), lr=self.lr, momentum=0.5)


def main():
    args = parse_args()
    L.seed_everything(args.seed)  # the same initial weights on every rank, and the shuffle's seed
    data_dir = args.data_dir or torchvision_root()  # offline
    model = FashionClassifier(data_dir, args.batch_size, args.lr)
    every = args.checkpoint_every or None
    checkpoints = ModelCheckpoint(dirpath=args.log_dir, every_n_train_steps=every, save_top_k=-1, save_last=False)
    strategy = bno.lightning.BalancedStrategy(args.strategy, args.rebalance_every, local_batchnorm=args.bn)  # bno-hvd: was strategy = "ddp"
    trainer = L.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=args.devices,
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        logger=CSVLogger(args.log_dir),
        log_every_n_steps=1,
        sync_batchnorm=args.sync_batchnorm,  # Lightning's SyncBatchNorm (the port's BatchNorm is exact either way)
        callbacks=[checkpoints] if every else [],
        enable_checkpointing=bool(every),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, ckpt_path=args.resume)
    trainer.test(model)


if __name__ == "__main__":
    main()
