"""Token sequences through the drop-ins, in float64: a script's plain loop over ``bno.DataLoader``
with ``Balancer.for_world(..., lengths=, cost=)`` and either drop-in.

Usage (one job runs every case given, each writing ``OUT_DIR/CASE/``)::

    mpirun -np 4 python text_dropin_cases.py DATA_DIR OUT_DIR counts cost unweighted      # Horovod
    torchrun --nproc-per-node 4 text_dropin_cases.py DATA_DIR OUT_DIR --dropin=ddp counts cost unweighted
    mpirun -np 1 python text_dropin_cases.py DATA_DIR OUT_DIR counts cost                 # the references

- ``counts``: ``lengths=`` alone: the split counts sequences (:data:`SPLITS`, a rank at 1 sequence in
  each), each rank's gradients are weighted by its share of the global batch's tokens;
- ``cost``: ``lengths=`` and ``cost=bno.measure_sequence_cost(model, ...)`` (measured on rank 0 of
  this job), global batches of ``global_tokens=`` :data:`TOKENS`: the split is by shares of that cost
  (:data:`SPLITS` read as shares);
- ``unweighted``: as ``counts`` without ``lengths=``: weighted by sequence counts, as for images (what
  the test shows to be wrong for a loss that is the mean over a rank's tokens).

One process (the reference) splits nothing: ``"equal"`` over a global batch of 16 sequences
(``counts``) or ``TOKENS`` tokens (``cost``, with ``cost="tokens"``: the global batch does not
depend on the cost). The loop is a plain script's: the loss is the mean over this rank's tokens.
Rank 0 writes ``model.pt`` and ``updates.json`` (per update: every rank's sequences, tokens and
weight); ``OUT_DIR/done-RANK`` marks a rank's work done (all that follows is its exit).
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import bno_hvd as bno
from bno_hvd.allocation import Strategy
from bno_hvd.data.gpt import GPTMini
from bno_hvd.data.tokens import IGNORE, collate_tokens, inputs_and_targets, load_text_datasets
from bno_hvd.processes.torchenv import finish_process_group

UPDATES, GLOBAL, TOKENS, SEED, MAX_LEN, VOCAB = 12, 16, 400, 5, 48, 512
SPLITS = [[1, 7, 3, 5], [6, 1, 4, 5], [9, 2, 4, 1], [1, 1, 5, 9], [4, 1, 3, 8], [2, 5, 8, 1]]  # every 2 updates


class Splits(Strategy):
    """The split of :data:`SPLITS`, changed at every rebalance (every 2 updates): sequences, or shares of work."""

    name = "splits"

    def __init__(self):
        super().__init__(4, GLOBAL // 4, global_batch=GLOBAL)

    def initial(self):
        return list(SPLITS[0])

    def rebalance(self, metrics, current, update):
        self._begin(metrics, current)
        return list(SPLITS[(update // 2) % len(SPLITS)])


def run_case(case, seqs, ddp, size, gather):
    torch.manual_seed(SEED)
    model = GPTMini(VOCAB, MAX_LEN)
    text = {"lengths": seqs.lengths} if case != "unweighted" else {}
    if case == "cost":
        text.update(cost=bno.measure_sequence_cost(model, VOCAB, MAX_LEN) if size > 1 else "tokens")
        text.update(global_tokens=TOKENS)
    strategy, batch = (Splits(), GLOBAL // 4) if size > 1 else ("equal", GLOBAL)
    sampler = bno.Balancer.for_world(seqs, batch, strategy, seed=SEED, rebalance_every=2, **text)
    loader = bno.DataLoader(seqs, sampler=sampler, collate_fn=collate_tokens)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    if ddp:
        model = bno.DistributedDataParallel(model, balancer=sampler)
    else:
        import horovod.torch as hvd

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = bno.DistributedOptimizer(optimizer, model.named_parameters(), balancer=sampler)
    rows = []
    while len(rows) < UPDATES:
        for tokens, lengths in loader:  # the plain loop of a script: nothing of bno-hvd inside
            step = sampler.current_step
            inputs, targets = inputs_and_targets(tokens, lengths)
            optimizer.zero_grad()
            logits = model(inputs, lengths)
            F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE).backward()
            optimizer.step()
            tokens, weights = zip(*gather((int(lengths.sum()), step.weight)))
            rows.append({"sizes": step.batch_sizes, "tokens": list(tokens), "weights": list(weights)})
            if len(rows) == UPDATES:
                break
    return (model.module if ddp else model), rows


def main():
    data_dir, out, *cases = sys.argv[1:]
    ddp = "--dropin=ddp" in cases
    cases = [c for c in cases if not c.startswith("--")]
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    if ddp:
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()

        def gather(obj):
            everyone = [None] * size
            dist.all_gather_object(everyone, obj)
            return everyone
    else:
        import horovod.torch as hvd

        hvd.init()
        rank, size, gather = hvd.rank(), hvd.size(), hvd.allgather_object
    seqs = load_text_datasets(data_dir, max_seq_len=MAX_LEN, vocab_size=VOCAB, with_test=False).train
    for case in cases:
        model, rows = run_case(case, seqs, ddp, size, gather)
        if rank == 0:
            os.makedirs(os.path.join(out, case), exist_ok=True)
            torch.save(model.state_dict(), os.path.join(out, case, "model.pt"))
            with open(os.path.join(out, case, "updates.json"), "w") as fh:
                json.dump(rows, fh)
    open(os.path.join(out, f"done-{rank}"), "w").close()
    if ddp:
        finish_process_group()  # as a script should: else a rank may abort at exit (pytorch/pytorch#190489)


if __name__ == "__main__":
    main()
