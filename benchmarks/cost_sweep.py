"""How well does a sequence's cost follow per-sequence, per-token and per-squared-length terms?

Fits :class:`bno_hvd.allocation.costmodel.SequenceCost` the way a run does at start-up
(:func:`bno_hvd.training.calibrate.measure`: lengths 8..max, two batch sizes each, the fastest of 5
interleaved rounds), then measures passes at every length of a finer sweep (tokens per pass held
near ``--tokens``) and prints the fit's prediction, the measurement and the relative error at
each, with the same for a model of tokens alone (what ``--allocate-by tokens`` assumes). One
process, one torch thread: nothing is emulated or throttled.

Usage (from the repository root)::

    source launch/mpi-env
    python benchmarks/cost_sweep.py --max-seq-len 256 --step 16
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from bno_hvd.allocation.costmodel import fit_sequence_cost
from bno_hvd.data.gpt import GPTMini
from bno_hvd.training.calibrate import measure


def time_pass(model, tokens, rounds: int) -> float:
    n, L = tokens.shape[0], tokens.shape[1] - 1
    best = float("inf")
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1], torch.full((n,), L))
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).backward()
        if r:
            best = min(best, time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-seq-len", type=int, default=256)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--step", type=int, default=16, help="lengths of the check sweep: step, 2 step, ...")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per pass in the check sweep")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPTMini(args.vocab_size, args.max_seq_len)
    rows = measure(model, args.vocab_size, args.max_seq_len, repeats=args.rounds)
    cost, fixed, errors = fit_sequence_cost(rows)
    print(
        f"fit on the start-up sweep ({len(rows)} passes): {fixed * 1e3:.3f} ms per pass + "
        f"{cost.per_sequence * 1e3:.4f} ms per sequence + {cost.per_token * 1e6:.3f} us per token + "
        f"{cost.per_squared * 1e9:.3f} ns per squared length; on its own points: median error "
        f"{statistics.median(abs(e) for e in errors):.1%}"
    )
    per_token = sum(t for _, _, t in rows) / sum(n * L for n, L, _ in rows)
    gen = torch.Generator().manual_seed(1)
    print(f"{'length':>6} {'seqs':>5} {'measured ms':>12} {'fit ms':>8} {'error':>7} {'tokens-only error':>18}")
    errs, token_errs = [], []
    for L in range(args.step, args.max_seq_len + 1, args.step):
        n = max(1, args.tokens // L)
        tokens = torch.randint(0, args.vocab_size, (n, L + 1), generator=gen)
        measured = time_pass(model, tokens, args.rounds)
        predicted = fixed + float(cost.pass_seconds(n, L))
        flat = per_token * n * L
        errs.append(predicted / measured - 1)
        token_errs.append(flat / measured - 1)
        print(
            f"{L:>6} {n:>5} {measured * 1e3:>12.2f} {predicted * 1e3:>8.2f} {errs[-1]:>+7.1%} {token_errs[-1]:>+18.1%}"
        )
    print(
        f"check sweep: |error| median {statistics.median(map(abs, errs)):.1%}, max {max(map(abs, errs)):.1%}; "
        f"tokens alone: median {statistics.median(map(abs, token_errs)):.1%}, max {max(map(abs, token_errs)):.1%}"
    )


if __name__ == "__main__":
    main()
