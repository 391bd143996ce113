"""bno-hvd on text in a Horovod script: the drop-in, each global batch split by what its sequences
cost on the model, each rank weighted by its share of the global batch's tokens (docs/text.md).

Run: horovodrun -np 4 --mpi python examples/text_loop.py"""

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence

import bno_hvd as bno
from bno_hvd.data import load_text_datasets  # offline: Debian's fortunes, tokenized (or a dir of .txt/.jsonl)


class GPT(nn.Module):
    """A small causal transformer: tokens [B, T] -> next-token logits [B, T, vocab]."""

    def __init__(self, vocab_size, max_seq_len, width=64):
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab_size, width), nn.Embedding(max_seq_len, width)
        block = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1]))
        causal = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], dtype=x.dtype)
        return self.head(self.blocks(x, mask=causal, is_causal=True))  # position j sees 0..j, never the padding


def collate(seqs):  # inputs and targets padded to this batch's longest sequence; padded targets -100: no loss
    return pad_sequence([s[:-1] for s in seqs], True), pad_sequence([s[1:] for s in seqs], True, padding_value=-100)


hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
data = load_text_datasets(None, max_seq_len=128, vocab_size=2048)
seqs = data.train  # token sequences of their own lengths (seqs.lengths)
model = GPT(data.vocab_size, 128)
cost = bno.measure_sequence_cost(model, data.vocab_size, 128)  # rank 0 times a sweep of lengths, before wrapping
sampler = bno.Balancer.for_world(seqs, 16, lengths=seqs.lengths, cost=cost, global_tokens=2048)
loader = bno.DataLoader(seqs, sampler=sampler, num_workers=1, collate_fn=collate)  # this rank's, shortest first
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = bno.DistributedOptimizer(optimizer, model.named_parameters(), balancer=sampler)
for _, (inputs, targets) in zip(range(40), loader):  # 40 updates, each of 2048 tokens or a few more
    optimizer.zero_grad()
    loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten(), ignore_index=-100)  # this rank's tokens
    loss.backward()
    optimizer.step()  # the gradients weighted by this rank's share of the tokens: the global batch's mean
tokens = hvd.allreduce(torch.tensor((targets != -100).sum().item()), op=hvd.Sum)
if hvd.rank() == 0:
    print(f"sequences per rank {sampler.batch_sizes}, {tokens} tokens, loss {loss.item():.4f}", flush=True)
