"""A plain PyTorch DDP script for a small GPT on text, launched by torchrun, ported to bno-hvd.

Written in the shape of examples/ddp_mnist.py (PyTorch's torchrun tutorial): the process group from
torchrun's environment, a DistributedSampler and a DataLoader per rank, a GPT built from its config
(nanoGPT's shape) wrapped in DistributedDataParallel, a training loop over epochs, the held-out
perplexity summed over the ranks. Its sequences keep their own lengths: a batch is padded to its
longest sequence, and the loss is the mean over the batch's real tokens. Every line of the port ends
in a "# bno-hvd:" comment that says what the plain DDP line was ("was <line>") or that it is new
("added"); putting those lines back gives the plain script (tests/library/test_text_examples.py
builds it). The port splits each global batch of sequences by what they cost on this model (measured
at start-up) and weights each rank by its share of the global batch's tokens, so the update is the
one a single process computes on the whole global batch. The line marked "# offline" reads the
project's built-in corpus (Debian's fortunes, tokenized here; nothing is downloaded) or --data-dir:

    torchrun --nproc-per-node 4 examples/ddp_text.py --epochs 1
"""

import argparse
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import bno_hvd as bno  # bno-hvd: added
from bno_hvd.data import load_text_datasets  # offline

IGNORE = -100  # the target of a padded position: no loss


def parse_args():
    parser = argparse.ArgumentParser(description="Train a small GPT on text with DDP under torchrun")
    parser.add_argument("--batch-size", type=int, default=16, help="training sequences per rank and step [16]")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the training set [1]")
    parser.add_argument("--lr", type=float, default=0.003, help="Adam's learning rate [0.003]")
    parser.add_argument("--max-seq-len", type=int, default=128, help="longest sequence; longer documents are cut")
    parser.add_argument("--vocab-size", type=int, default=2048, help="entries of the BPE vocabulary [2048]")
    parser.add_argument("--seed", type=int, default=42, help="seeds the initial weights and the shuffle [42]")
    parser.add_argument("--log-interval", type=int, default=20, help="steps between two progress lines [20]")
    parser.add_argument("--data-dir", help="a folder of .txt/.jsonl documents [the built-in corpus]")
    parser.add_argument("--strategy", default="balanced", help="how bno-hvd splits each global batch")  # bno-hvd: added
    parser.add_argument("--rebalance-every", type=int, default=10, help="updates between two splits")  # bno-hvd: added
    return parser.parse_args()


@dataclass
class GPTConfig:
    vocab_size: int
    max_seq_len: int
    width: int = 64
    heads: int = 4
    layers: int = 2


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x MLP, each with a residual."""

    def __init__(self, config):
        super().__init__()
        self.heads = config.heads
        self.norm1, self.norm2 = nn.LayerNorm(config.width), nn.LayerNorm(config.width)
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)
        width = config.width
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # j sees 0..j: never the padding on its right
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """A small decoder-only language model: tokens [B, T] -> next-token logits [B, T, vocab]."""

    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.width)
        self.position = nn.Embedding(config.max_seq_len, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * config.layers) if name.endswith("proj.weight") else 0.02)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def collate(sequences):
    """Inputs and next-token targets [B, T], right-padded to the longest sequence (targets with IGNORE)."""
    inputs = pad_sequence([s[:-1] for s in sequences], batch_first=True)
    targets = pad_sequence([s[1:] for s in sequences], batch_first=True, padding_value=IGNORE)
    return inputs, targets


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
    tokens = 0
    for step, (inputs, targets) in enumerate(train_loader):
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad()
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)  # this batch's tokens
        loss.backward()  # DDP combines the ranks' gradients as they are computed
        optimizer.step()
        tokens += int((targets != IGNORE).sum())
        if step % log_interval == 0:
            print(
                f"rank {dist.get_rank()}, epoch {epoch}, step {step}/{len(train_loader)}: "
                f"{len(inputs)} sequences, {tokens} tokens so far, loss {loss.item():.4f}"
            )


def test(model, test_loader, device):
    """Perplexity on the held-out split: each rank sums its part's loss and tokens, the ranks sum."""
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, tokens
    with torch.no_grad():
        for inputs, targets in test_loader:
            inputs, targets = inputs.to(device), targets.to(device)
            logits = model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum")
            totals[0] += loss.item()
            totals[1] += (targets != IGNORE).sum().item()
    dist.all_reduce(totals)
    if dist.get_rank() == 0:
        loss = (totals[0] / totals[1]).item()
        print(f"test set: perplexity {math.exp(loss):.2f} (loss {loss:.4f} over {int(totals[1])} tokens)", flush=True)


def main():
    args = parse_args()
    device = setup()
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also sends rank 0's)
    torch.set_num_threads(1)  # one thread per rank: the ranks of a host share its cores

    data = load_text_datasets(args.data_dir, max_seq_len=args.max_seq_len, vocab_size=args.vocab_size)  # offline
    train_set, test_set = data.train, data.test  # token sequences of their own lengths (train_set.lengths)
    model = GPT(GPTConfig(data.vocab_size, args.max_seq_len)).to(device)

    # each rank reads its own part of the training set, and of the test split
    cost = bno.measure_sequence_cost(model, data.vocab_size, args.max_seq_len)  # bno-hvd: added
    balance = {"seed": args.seed, "rebalance_every": args.rebalance_every, "lengths": train_set.lengths}  # bno-hvd: added
    train_sampler = bno.Balancer.for_world(train_set, args.batch_size, args.strategy, cost=cost, **balance)  # bno-hvd: was train_sampler = DistributedSampler(train_set, seed=args.seed)
    train_loader = bno.DataLoader(train_set, sampler=train_sampler, collate_fn=collate)  # bno-hvd: was train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler, collate_fn=collate)
    test_sampler = DistributedSampler(test_set, shuffle=False)
    test_loader = DataLoader(test_set, batch_size=64, sampler=test_sampler, collate_fn=collate)

    device_ids = [device.index] if device.type == "cuda" else None
    model = bno.DistributedDataParallel(model, balancer=train_sampler, device_ids=device_ids)  # bno-hvd: was model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(1, args.epochs + 1):
        train(epoch, model, optimizer, train_loader, train_sampler, device, args.log_interval)
        test(model, test_loader, device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
