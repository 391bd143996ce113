"""The flags of text training (``--dataset text``), added to the shared ones of :mod:`bno_hvd.cli.flags`."""

from __future__ import annotations

import click

from bno_hvd.common.parsing import CAP, Range, parse_int_list
from bno_hvd.training.config import TrainConfig

D = TrainConfig()
TOKEN_CAP = Range(1, CAP.high * 1000, "token cap")

TEXT_OPTIONS = [
    (
        "max-seq-len",
        click.option(
            "--max-seq-len",
            type=int,
            default=D.max_seq_len,
            show_default=True,
            help="text: most tokens (predictions) per sequence; longer documents are cut into pieces.",
        ),
    ),
    (
        "vocab-size",
        click.option(
            "--vocab-size",
            type=int,
            default=D.vocab_size,
            show_default=True,
            help="text: entries of the byte-level BPE tokenizer trained (offline, cached) on the training text.",
        ),
    ),
    (
        "allocate-by",
        click.option(
            "--allocate-by",
            type=click.Choice(["samples", "tokens", "cost"]),
            default=None,
            help="text: what the strategy splits: sequence counts, shares of tokens, or shares of measured cost "
            "(per sequence, token and squared length) that a length-aware sampler fills. Default: cost "
            "(samples with --strategy fixed).",
        ),
    ),
    (
        "global-tokens",
        click.option(
            "--global-tokens",
            type=int,
            default=None,
            help="text (--allocate-by tokens/cost): the global batch in tokens (the fewest next sequences "
            "that reach it) instead of sequences (--global-batch).",
        ),
    ),
    (
        "max-tokens",
        click.option(
            "--max-tokens",
            default=None,
            help="text: memory cap in padded tokens per forward/backward pass, one for all ranks or one per "
            "rank (e.g. 4096,4096,4096,1024); a larger share runs in micro-batches with gradient accumulation.",
        ),
    ),
]


def text_values(kw: dict) -> dict:
    """The text flags' values parsed in place (``--max-tokens`` as a tuple of ints)."""
    kw["max_tokens"] = parse_int_list(kw.get("max_tokens"), "--max-tokens", TOKEN_CAP)
    return kw
