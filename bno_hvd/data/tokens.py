"""Token sequences for causal language models: a tokenizer trained offline and cached, documents
cut into sequences of their own lengths, and the padded batches a model gets.

Tokenizer: Hugging Face ``tokenizers``, byte-level BPE (GPT-2's scheme: every byte is in the
alphabet, so any UTF-8 text encodes and nothing is unknown), trained on the training documents
with ``vocab_size`` entries and cached as ``<cache>/tokenizers/<sha256>.json`` (default cache
``~/.cache/bno-hvd``; the hash covers the documents and the settings). Training is deterministic,
so every rank has the same tokenizer, also when each trains its own; nothing is downloaded.

Sequences: a document is encoded as ``[EOS] + tokens + [EOS]`` (``EOS`` = ``<|endoftext|>``, id 0;
the first one also makes the document's first token a prediction). A document of ``m + 1``
tokens holds ``m`` predictions and becomes ``ceil(m / M)`` sequences (``M = max_seq_len``):
sequence ``k`` holds tokens ``[k M, k M + m_k]``, ``m_k <= M`` predictions, and consecutive pieces
share one boundary token, so every prediction of the document is made exactly once. A
sequence's *length* is its number of predictions (the model's input positions): loss weights,
``--max-tokens`` caps, ``--global-tokens`` and tokens/s all count these. Nothing is padded to a
fixed length: a batch is padded (on the right) to its longest sequence only
(:func:`collate_tokens`), and the targets of padded positions are ``IGNORE`` (-100).

Split: a fixed 5% of the documents (at least one) is held out as the test split, on which
perplexity is measured; the rest are the training split.

Usage::

    data = load_text_datasets(None, max_seq_len=256, vocab_size=2048)   # built-in corpus
    tokens, lengths = collate_tokens([data.train[0], data.train[1]])
    inputs, targets = inputs_and_targets(tokens, lengths)
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from bno_hvd.common.atomic import atomic_write
from bno_hvd.common.errors import UsageError
from bno_hvd.data.corpus import read_documents

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per rank; no warning when workers fork

EOS = "<|endoftext|>"
IGNORE = -100  # target of a padded position (torch's cross_entropy ignore_index)
TEST_FRACTION = 0.05
SPLIT_SEED = 20240501  # the held-out documents do not change with --seed
FORMAT = "bno-hvd-bpe-1"


def cache_root(cache: str | None = None) -> str:
    return os.path.expanduser(cache or os.path.join("~", ".cache", "bno-hvd"))


def train_tokenizer(docs: list[str], vocab_size: int):
    """A byte-level BPE tokenizer of ``vocab_size`` entries trained on ``docs`` (``EOS`` is id 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer)
    return tok


def cached_tokenizer(docs: list[str], vocab_size: int, cache: str | None = None):
    """:func:`train_tokenizer` once per corpus and size; later runs (and other ranks) read the file."""
    import tokenizers
    from tokenizers import Tokenizer

    digest = hashlib.sha256(f"{FORMAT} {tokenizers.__version__} {vocab_size}\n".encode())
    for doc in docs:
        digest.update(doc.encode("utf-8") + b"\x00")
    path = os.path.join(cache_root(cache), "tokenizers", digest.hexdigest()[:32] + ".json")
    if os.path.isfile(path):
        try:
            return Tokenizer.from_file(path)
        except Exception:  # noqa: BLE001 - a damaged cache file is trained again
            pass
    tok = train_tokenizer(docs, vocab_size)
    text = tok.to_str()
    try:
        atomic_write(path, lambda fh: fh.write(text))
    except OSError:
        pass  # a read-only home: train again next time
    return tok


class TokenSequences(Dataset):
    """Sequences of token ids, each of its own length: item ``i`` is a LongTensor of
    ``lengths[i] + 1`` tokens (``lengths[i]`` predictions). ``lengths`` is an int64 array."""

    def __init__(self, tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
        self.tokens, self.starts, self.lengths = tokens, starts, lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i):
        start = int(self.starts[i])
        return torch.from_numpy(self.tokens[start : start + int(self.lengths[i]) + 1].astype(np.int64))


def cut_into_sequences(docs_ids: list[list[int]], max_seq_len: int) -> tuple[TokenSequences, int]:
    """Every document's ids (with both EOS) as sequences of at most ``max_seq_len`` predictions;
    also how many documents had to be cut."""
    flat, starts, lengths, cut = [], [], [], 0
    at = 0
    for ids in docs_ids:
        m = len(ids) - 1
        if m > max_seq_len:
            cut += 1
        flat.append(np.asarray(ids, dtype=np.int32))
        for k in range(0, m, max_seq_len):
            starts.append(at + k)
            lengths.append(min(max_seq_len, m - k))
        at += len(ids)
    tokens = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int32)
    return TokenSequences(tokens, np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)), cut


def collate_tokens(samples) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, lengths)``: int64 ``[B, T + 1]`` right-padded with 0 (T: the longest sequence's
    predictions) and int64 ``[B]`` predictions per sequence."""
    lengths = torch.tensor([len(s) - 1 for s in samples], dtype=torch.int64)
    out = torch.zeros(len(samples), int(lengths.max()) + 1 if len(samples) else 1, dtype=torch.int64)
    for row, s in enumerate(samples):
        out[row, : len(s)] = s
    return out, lengths


def inputs_and_targets(tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Model inputs ``[B, T]`` and next-token targets ``[B, T]`` (``IGNORE`` where padded)."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:].clone()
    positions = torch.arange(targets.shape[1], device=targets.device)
    targets[positions[None, :] >= lengths.to(targets.device)[:, None]] = IGNORE
    return inputs, targets


@dataclass
class TextData:
    """What :func:`load_text_datasets` gives: the splits, the tokenizer, and notes for the user."""

    train: TokenSequences
    test: TokenSequences | None
    tokenizer: object
    vocab_size: int
    notes: list[str]


def held_out(n_docs: int) -> np.ndarray:
    """A boolean mask of the documents of the test split (fixed, 5%, at least one)."""
    if n_docs < 2:
        raise UsageError(f"the text has {n_docs} document(s); training and a held-out split need at least 2")
    test = np.zeros(n_docs, dtype=bool)
    order = np.random.default_rng(SPLIT_SEED).permutation(n_docs)
    test[order[: max(1, round(TEST_FRACTION * n_docs))]] = True
    return test


def load_text_datasets(
    data_dir: str | None, *, max_seq_len: int, vocab_size: int, with_test: bool = True, cache: str | None = None
) -> TextData:
    """The training (and test) sequences of the built-in corpus or of ``data_dir``."""
    docs = read_documents(data_dir)
    test_mask = held_out(len(docs))
    train_docs = [d for d, t in zip(docs, test_mask) if not t]
    tok = cached_tokenizer(train_docs, vocab_size)
    eos = tok.token_to_id(EOS)

    def encode(texts):
        return [[eos, *e.ids, eos] for e in tok.encode_batch(texts)]

    train, cut = cut_into_sequences(encode(train_docs), max_seq_len)
    test = None
    if with_test:
        test, _ = cut_into_sequences(encode([d for d, t in zip(docs, test_mask) if t]), max_seq_len)
    notes = []
    if cut:
        notes.append(
            f"{cut} of {len(train_docs)} training documents are longer than --max-seq-len {max_seq_len} tokens "
            f"and were cut into pieces ({len(train)} sequences in all)"
        )
    return TextData(train, test, tok, tok.get_vocab_size(), notes)
