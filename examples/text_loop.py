"""bno-hvd on text in your own Horovod loop. Run: horovodrun -np 4 --mpi python examples/text_loop.py"""

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from mpi4py import MPI

from bno_hvd import Balancer, TextOptions, make_strategy
from bno_hvd.allocation.costmodel import UNITS, work_per_sequence
from bno_hvd.data.gpt import GPTMini
from bno_hvd.data.tokens import IGNORE, collate_tokens, inputs_and_targets, load_text_datasets
from bno_hvd.training.calibrate import calibrate

hvd.init()
torch.set_num_threads(1)
data = load_text_datasets(None, max_seq_len=128, vocab_size=2048)  # Debian's fortunes, or a dir of .txt/.jsonl
seqs = data.train  # token sequences of their own lengths (seqs.lengths)
model = GPTMini(data.vocab_size, max_seq_len=128)
cost = calibrate(MPI.COMM_WORLD.Dup(), model, data.vocab_size, 128)["cost"]  # a sweep of lengths, before wrapping
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Sum)
strategy = make_strategy("balanced", hvd.size(), 16 * UNITS)  # shares of work; UNITS = one average sequence
work = work_per_sequence(seqs.lengths, cost)
text = TextOptions(lengths=seqs.lengths, work=work, cost=cost, shares=True, global_tokens=2048)
bal = Balancer(MPI.COMM_WORLD.Dup(), strategy, len(seqs), text=text)
loader = bal.loader(seqs, num_workers=1, collate_fn=collate_tokens)  # this rank's sequences, shortest first
for batch in bal.batches(loader, updates=40):
    step = bal.start_step(batch)  # weight = this rank's tokens / the global batch's tokens
    inputs, targets = inputs_and_targets(*batch.data)  # padded to this batch's longest; padding ignored
    opt.zero_grad()
    logits = model(inputs, batch.data[1])
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    (loss * step.weight).backward()
    bal.end_compute()
    opt.step()  # Horovod allreduce, op=Sum: the mean over every token of the global batch
    bal.end_step()
if hvd.rank() == 0:
    print(f"sequences per rank {step.batch_sizes}, {step.global_tokens} tokens, loss {loss.item():.4f}", flush=True)
