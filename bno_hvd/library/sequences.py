"""Token sequences through ``Balancer.for_world`` (and so through both drop-ins): what a sequence
costs on the model (:func:`measure_sequence_cost`), and the Balancer's options for a split by it.

A rank's loss weight is its share of the global batch's *tokens* as soon as ``for_world`` is given
``lengths=`` (one length per sample): the Horovod drop-in's optimizer and the DDP drop-in's hook
multiply each rank's gradients by it, so a loss that is the mean over this rank's tokens becomes the
mean over every token of the global batch, exactly what one process computes on it. ``cost=``
splits the global batch by what its sequences cost instead of by their count: ``"tokens"`` (a
sequence costs its length) or what :func:`measure_sequence_cost` fitted (per sequence, per token,
per squared length: attention). The strategy then splits *shares of work*
(:mod:`bno_hvd.allocation.costmodel`: ``UNITS`` per average sequence), which the length-aware sampler
fills with sequences (:mod:`bno_hvd.allocation.partition`).

Usage::

    cost = bno.measure_sequence_cost(model, vocab_size, max_seq_len)      # collective, before wrapping
    sampler = bno.Balancer.for_world(seqs, 16, lengths=seqs.lengths, cost=cost, global_tokens=2048)
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

from bno_hvd.allocation.costmodel import TOKENS, UNITS, SequenceCost, fit_sequence_cost, fit_warning, work_per_sequence
from bno_hvd.common.arguments import check_int, check_optional_int, describe, first_line, per_sample
from bno_hvd.common.errors import UsageError
from bno_hvd.library.step import TextOptions
from bno_hvd.processes.world import one_line_errors

__all__ = ["measure_sequence_cost", "text_split"]

SWEEP = (8, 16, 32, 64, 128, 256, 512, 1024)
TOKENS_PER_PASS = 512


def sweep_lengths(max_seq_len: int) -> list[int]:
    return sorted({L for L in SWEEP if L <= max_seq_len} | {max_seq_len})


def measure(
    model, vocab_size: int, max_seq_len: int, repeats: int = 5, seed: int = 0, with_lengths: bool = True
) -> list[tuple[int, int, float]]:
    """``(sequences, length, seconds)`` of forward+backward passes over the sweep: the fastest of
    ``repeats`` rounds (what the pass costs; slower ones met another process on the core). The
    rounds interleave every point of the sweep, so a burst of contention does not bend one length.
    ``with_lengths``: the model is called as ``model(tokens, lengths)``, else ``model(tokens)``."""
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)  # time the kernels, not their launch
    points = []
    for length in sweep_lengths(max_seq_len):
        many = max(2, TOKENS_PER_PASS // length)
        points += [(n, length) for n in (many, max(1, many // 4))]
    batches = [torch.randint(0, vocab_size, (n, L + 1), generator=gen).to(device) for n, L in points]
    best = [float("inf")] * len(points)
    for round_ in range(repeats + 1):  # round 0 warms up
        for i, tokens in enumerate(batches):
            n, L = points[i]
            sync()
            t0 = time.perf_counter()
            args = (tokens[:, :-1], torch.full((n,), L, device=device)) if with_lengths else (tokens[:, :-1],)
            logits = model(*args)
            logits = logits[0] if isinstance(logits, (tuple, list)) else logits
            F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).backward()
            sync()
            if round_:
                best[i] = min(best[i], time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    return [(n, L, t) for (n, L), t in zip(points, best)]


def measure_sequence_cost(model, vocab_size: int, max_seq_len: int, *, comm=None) -> SequenceCost:
    """Collective: what a sequence of each length costs on ``model``, for ``Balancer.for_world(...,
    cost=)``. Rank 0 times forward+backward passes of random tokens over a sweep of lengths (8 up to
    ``max_seq_len``, two batch sizes each, the fastest of 5 interleaved rounds) while the other ranks
    wait (ranks that share cores would time each other), and every rank fits the same cost of a
    sequence of length L, ``s + t L + q L^2`` (per sequence, per token, per squared length), by
    non-negative least squares. Call it on the plain model, before a drop-in wraps it (its passes
    must not reach an allreduce); it leaves no gradients. Rank 0 prints one ``bno-hvd: note:`` line
    when the fit is off by more than 20% somewhere on the sweep (a busy machine).

    Args:
        model: the language model (an ``nn.Module`` on its device); ``model(tokens)`` with
            ``tokens`` int64 ``[B, L]`` returns logits ``[B, L, vocab_size]`` (or a tuple whose
            first item they are, as nanoGPT's ``(logits, loss)``).
        vocab_size: the token ids the sweep draws from (0 to ``vocab_size - 1``).
        max_seq_len: the longest sequence the model takes (the sweep's last length).
        comm: an mpi4py communicator or a ``TorchComm`` (None: the job's world, as ``for_world``).

    Returns:
        the fitted cost (a ``SequenceCost``; checkpoints of the Balancer keep it).

    Example::

        model = GPT(config)                                   # the plain model
        cost = bno.measure_sequence_cost(model, config.vocab_size, config.max_seq_len)
        train_sampler = bno.Balancer.for_world(seqs, 16, lengths=seqs.lengths, cost=cost)
    """
    one_line_errors()
    if not isinstance(model, torch.nn.Module) or next(model.parameters(), None) is None:
        raise UsageError(f"measure_sequence_cost needs the model (an nn.Module with parameters), got {describe(model)}")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise UsageError("measure_sequence_cost: pass the plain model, before bno.DistributedDataParallel wraps it")
    check_int("vocab_size", vocab_size, 1, 10**8, "the number of token ids the model embeds")
    check_int("max_seq_len", max_seq_len, 1, 10**6, "the longest sequence the model takes")
    if comm is None:
        from bno_hvd.processes.torchenv import world_control_comm

        comm = world_control_comm()
    elif not all(callable(getattr(comm, name, None)) for name in ("Get_rank", "bcast")):
        raise UsageError(
            f"comm must be an mpi4py communicator or a TorchComm (or None: the job's world), got {describe(comm)}"
        )
    rows = None
    if comm.Get_rank() == 0:
        try:
            rows = measure(model, vocab_size, max_seq_len, with_lengths=False)
        except (RuntimeError, ValueError, TypeError, IndexError) as err:
            rows = first_line(err, 200)
    rows = comm.bcast(rows, root=0)
    if isinstance(rows, str):  # every rank raises the same line, none waits for the others
        raise UsageError(
            f"measure_sequence_cost: a pass of model(tokens [B, L]) failed ({rows}); it must return logits "
            "[B, L, vocab_size] for every L up to max_seq_len"
        )
    cost, _, errors = fit_sequence_cost(rows)
    warning = fit_warning(rows, errors)
    if warning and comm.Get_rank() == 0:
        warning = warning.replace("--allocate-by tokens", "cost='tokens'")
        print(f"bno-hvd: note: {warning}", file=sys.stderr, flush=True)
    return cost


def text_split(
    length: int, size: int, batch_size: int, global_batch, *, lengths, cost, global_tokens
) -> tuple[dict, TextOptions | None]:
    """What ``for_world``'s ``lengths=``/``cost=``/``global_tokens=`` make: the arguments of
    ``make_strategy`` (``base_batch_size``, ``global_batch``: in ``UNITS`` of work when split by
    cost) and the Balancer's :class:`~bno_hvd.TextOptions` (None without ``lengths``)."""
    sizes = {"base_batch_size": batch_size, "global_batch": global_batch}
    if lengths is None:
        if cost is not None or global_tokens is not None:
            raise UsageError("cost= and global_tokens= split token sequences: give lengths= too (the tokens of each)")
        return sizes, None
    lengths = per_sample("lengths", lengths, length, integers=True, low=1)
    check_optional_int("global_tokens", global_tokens, 1, 10**15, "the tokens of one global batch")
    if cost is None:
        if global_tokens is not None:
            raise UsageError("global_tokens= fixes the global batch in tokens, which a split by cost fills: add cost=")
        return sizes, TextOptions(lengths=lengths)
    if isinstance(cost, str) and cost == "tokens":
        cost = TOKENS
    elif not isinstance(cost, SequenceCost):
        raise UsageError(
            f"cost must be 'tokens' or what bno.measure_sequence_cost(model, ...) returned, got {describe(cost)}"
        )
    most = 10**6 // UNITS  # a strategy splits at most 10**6 units of work per rank
    check_int("batch_size", batch_size, 1, most, "sequences per rank on average, when split by cost")
    check_optional_int("global_batch", global_batch, size, size * most, "sequences per update, when split by cost")
    sequences = global_batch or size * batch_size
    if global_tokens is not None and global_tokens > int(lengths.sum()):
        raise UsageError(
            f"global_tokens={global_tokens} is more than the {int(lengths.sum())} tokens of the whole dataset; "
            "a global batch takes at most one epoch of it"
        )
    if global_tokens is not None:  # the work of a typical global batch of that many tokens
        sequences = min(size * most, max(size, round(global_tokens / float(lengths.mean()))))
    try:
        work = work_per_sequence(lengths, cost)
    except ValueError:
        raise UsageError("the cost gives every sequence zero cost; measure it again, or use cost='tokens'") from None
    text = TextOptions(
        lengths=lengths,
        work=work,
        cost=cost,
        shares=True,
        global_count=global_batch or size * batch_size,
        global_tokens=global_tokens,
    )
    # as ``bno-hvd train`` splits text (bno_hvd.training.tasks): the base is a rank's share of the global batch
    return {"base_batch_size": max(1, round(UNITS * sequences / size)), "global_batch": sequences * UNITS}, text
