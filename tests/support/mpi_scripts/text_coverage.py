"""Each rank reads token sequences through Balancer.loader (real DataLoader, 2 workers, the text
collate) while a `random` allocation changes every 2 updates; writes what it saw for the test.

    mpirun -np 4 python tests/support/mpi_scripts/text_coverage.py DATA_DIR OUT_DIR MODE
MODE: counts (the strategy splits sequence counts), or shares (it splits shares of work, the tokens
of each sequence, in global batches of at least 60 tokens that the length-aware sampler cuts).
"""

import json
import sys

import torch
from mpi4py import MPI
from torch.utils.data import Dataset

from bno_hvd import Balancer, TextOptions, make_strategy
from bno_hvd.allocation.costmodel import TOKENS, UNITS, work_per_sequence
from bno_hvd.data.tokens import collate_tokens, load_text_datasets

UPDATES, SEED = 40, 13


class Tagged(Dataset):
    """The sequences, each with its index: what the test checks coverage by."""

    def __init__(self, seqs):
        self.seqs = seqs

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return i, self.seqs[i]


def collate(samples):
    return torch.tensor([i for i, _ in samples]), collate_tokens([s for _, s in samples])


data_dir, out_dir, mode = sys.argv[1], sys.argv[2], sys.argv[3]
comm = MPI.COMM_WORLD.Dup()
rank, size = comm.Get_rank(), comm.Get_size()
torch.set_num_threads(1)
seqs = load_text_datasets(data_dir, max_seq_len=8, vocab_size=300, with_test=False).train
split = {"lengths": seqs.lengths}
base = 3
if mode == "shares":
    split.update(work=work_per_sequence(seqs.lengths, TOKENS), shares=True, global_tokens=60)
    base = 3 * UNITS
bal = Balancer(
    comm,
    make_strategy("random", size, base, seed=SEED),
    len(seqs),
    seed=SEED,
    rebalance_every=2,
    text=TextOptions(**split),
)
seen = []
for batch in bal.batches(bal.loader(Tagged(seqs), num_workers=2, collate_fn=collate), UPDATES):
    step = bal.start_step(batch)
    indices, (tokens, lengths) = batch.data
    seen.append(
        {
            "update": step.update,
            "sizes": step.batch_sizes,
            "weight": step.weight,
            "global_tokens": step.global_tokens,
            "indices": indices.tolist(),
            "lengths": lengths.tolist(),
        }
    )
    bal.end_compute()
    bal.end_step()
with open(f"{out_dir}/rank{rank}.json", "w") as fh:
    json.dump({"rank": rank, "n": len(seqs), "lengths": seqs.lengths.tolist(), "seen": seen}, fh)
comm.Barrier()
