"""The checks of a :class:`~bno_hvd.training.config.TrainConfig`'s text fields (``--dataset text``),
in the form of its ``PAIR_RULES``: ``(fails?(cfg), message(cfg))``, the first failing one reported."""

from __future__ import annotations

from bno_hvd.data.catalog import TEXT_MODEL_NAMES

UNITS = ("samples", "tokens", "cost")
MAX_TOKEN_CAP = 10**9


def _needs_a_language_model(c) -> bool:
    return c.dataset == "text" and c.model not in TEXT_MODEL_NAMES and ":" not in c.model


TEXT_RULES = (
    (
        lambda c: not 1 <= c.max_seq_len <= 65536,
        lambda c: f"--max-seq-len must be between 1 and 65536 tokens, got {c.max_seq_len}",
    ),
    (
        lambda c: not 257 <= c.vocab_size <= 1_000_000,
        lambda c: f"--vocab-size must be between 257 (the 256 bytes and end-of-text) and 1000000, got {c.vocab_size}",
    ),
    (
        lambda c: c.max_tokens is not None and not all(1 <= m <= MAX_TOKEN_CAP for m in c.max_tokens),
        lambda c: f"--max-tokens caps must be integers between 1 and {MAX_TOKEN_CAP}, got {c.max_tokens}",
    ),
    (
        lambda c: c.allocate_by is not None and c.allocate_by not in UNITS,
        lambda c: f"--allocate-by {c.allocate_by!r}: use {', '.join(UNITS)}",
    ),
    (
        lambda c: c.global_tokens is not None and not 1 <= c.global_tokens <= MAX_TOKEN_CAP,
        lambda c: f"--global-tokens must be between 1 and {MAX_TOKEN_CAP}, got {c.global_tokens}",
    ),
    (
        _needs_a_language_model,
        lambda c: f"--dataset text needs a language model: --model gpt-mini or package.module:function, not {c.model}",
    ),
    (
        lambda c: c.dataset != "text" and c.model in TEXT_MODEL_NAMES,
        lambda c: f"--model {c.model} is a language model: use it with --dataset text",
    ),
    (
        lambda c: c.dataset != "text" and c.allocate_by in ("tokens", "cost"),
        lambda c: f"--allocate-by {c.allocate_by} splits token sequences (--dataset text); images split samples",
    ),
    (
        lambda c: c.dataset != "text" and c.max_tokens is not None,
        lambda c: "--max-tokens caps token sequences (--dataset text); cap images with --max-batch",
    ),
    (
        lambda c: c.dataset == "text" and (c.max_batch is not None or c.max_batch_auto),
        lambda c: "--max-batch counts samples; for --dataset text cap each pass in tokens with --max-tokens",
    ),
    (
        lambda c: c.dataset == "text" and c.num_classes is not None,
        lambda c: "--num-classes does not apply to --dataset text (the model predicts --vocab-size tokens)",
    ),
    (
        lambda c: c.max_tokens is not None and min(c.max_tokens) < c.max_seq_len,
        lambda c: (
            f"--max-tokens {min(c.max_tokens)} is below --max-seq-len {c.max_seq_len}: a sequence of "
            f"{c.max_seq_len} tokens must fit in one pass; raise the cap or lower --max-seq-len"
        ),
    ),
    (
        lambda c: c.global_tokens is not None and c.allocation_unit == "samples",
        lambda c: "--global-tokens needs --allocate-by tokens or cost (a global batch of samples is --global-batch)",
    ),
    (
        lambda c: c.strategy == "bno" and c.allocation_unit != "samples",
        lambda c: (
            "--strategy bno changes the global batch, which --allocate-by tokens/cost keeps fixed; "
            "add --allocate-by samples"
        ),
    ),
)
