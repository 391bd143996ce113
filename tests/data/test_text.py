"""Text data: Debian's fortunes, users' .txt/.jsonl, the bad inputs (one clear line each), the
offline BPE tokenizer and its cache, sequences cut at --max-seq-len with every prediction once."""

import json

import numpy as np
import pytest
import torch

from bno_hvd.common.errors import UsageError
from bno_hvd.data.corpus import FORTUNES_DIR, read_documents
from bno_hvd.data.tokens import (
    IGNORE,
    cached_tokenizer,
    collate_tokens,
    cut_into_sequences,
    held_out,
    inputs_and_targets,
    load_text_datasets,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def fortunes_available():
    import os

    if not os.path.isdir(FORTUNES_DIR):
        pytest.skip(f"{FORTUNES_DIR} missing: apt-get install fortunes (launch/setup does)")


def test_the_built_in_corpus_is_real_and_long_tailed(fortunes_available):
    docs = read_documents(None)
    assert len(docs) > 5000
    assert all(d and d == d.strip() and "\x08" not in d for d in docs)  # no overstriking left
    lengths = np.array([len(d) for d in docs])
    median, p99 = np.percentile(lengths, [50, 99])
    print(f"{len(docs)} fortunes, median {median:.0f} characters, 99th percentile {p99:.0f}, max {lengths.max()}")
    assert p99 > 5 * median  # the long tail that makes counting sequences wrong


def test_txt_and_jsonl_files_are_documents(tmp_path):
    (tmp_path / "a.txt").write_text("first line\nsecond line\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "a json\ndocument", "id": 3}) + "\n")
    (tmp_path / "notes.md").write_text("ignored\n")
    assert read_documents(str(tmp_path)) == ["first line", "second line", "a json\ndocument"]


@pytest.mark.parametrize(
    "files,words",
    [
        ({}, ["holds no .txt or .jsonl files"]),
        ({"a.txt": b"one\n\nthree\n"}, ["a.txt line 2 is empty", "remove empty lines"]),
        ({"a.txt": b"caf\xe9\n"}, ["a.txt is not UTF-8", "byte 0xe9 on line 1", "iconv"]),
        ({"a.jsonl": b'{"text": 1}\n'}, ['a.jsonl line 1 has no "text" string']),
        ({"a.jsonl": b"{nope\n"}, ["a.jsonl line 1 is not JSON"]),
    ],
    ids=["empty directory", "empty line", "not UTF-8", "no text field", "not JSON"],
)
def test_bad_text_input_is_one_clear_line(tmp_path, files, words):
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    with pytest.raises(UsageError) as err:
        read_documents(str(tmp_path))
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_long_documents_are_cut_so_every_prediction_happens_once():
    docs = [list(range(100, 100 + n)) for n in (2, 5, 11, 12, 13)]  # m = n - 1 predictions each
    seqs, cut = cut_into_sequences(docs, max_seq_len=4)
    assert cut == 3 and seqs.lengths.max() == 4 and seqs.lengths.min() >= 1
    pairs = []
    for i in range(len(seqs)):
        s = seqs[i].tolist()
        assert len(s) == seqs.lengths[i] + 1
        pairs += list(zip(s[:-1], s[1:]))  # (input, target) of every prediction
    expected = [p for d in docs for p in zip(d[:-1], d[1:])]
    assert sorted(pairs) == sorted(expected) and len(pairs) == len(expected)


def test_the_tokenizer_is_trained_offline_deterministically_and_cached(tmp_path):
    docs = [f"document {i}: the quick brown fox jumps over {i * 7} lazy dogs" for i in range(200)]
    first = cached_tokenizer(docs, 300, cache=str(tmp_path))
    files = list((tmp_path / "tokenizers").iterdir())
    assert len(files) == 1
    again = cached_tokenizer(docs, 300, cache=str(tmp_path))  # read from the file
    assert first.to_str() == again.to_str() and first.get_vocab_size() == 300
    text = "héllo wörld — ✓ unseen bytes"
    assert first.decode(first.encode(text).ids) == text  # byte-level: nothing is unknown


def test_text_datasets_hold_out_whole_documents(tmp_path):
    lines = [" ".join(["word"] * (1 + (i * 37) % 90)) + f" end {i}" for i in range(60)]
    (tmp_path / "d.txt").write_text("\n".join(lines) + "\n")
    data = load_text_datasets(str(tmp_path), max_seq_len=16, vocab_size=300, cache=str(tmp_path / "cache"))
    assert held_out(60).sum() == 3 and len(data.test) >= 3
    assert data.train.lengths.max() <= 16 and data.notes and "cut into pieces" in data.notes[0]
    assert data.train.lengths.sum() + data.test.lengths.sum() > sum(len(line.split()) for line in lines)


def test_batches_pad_to_their_longest_sequence_and_ignore_the_padding():
    a, b = torch.tensor([0, 5, 6, 0]), torch.tensor([0, 7, 0])
    tokens, lengths = collate_tokens([a, b])
    assert tokens.tolist() == [[0, 5, 6, 0], [0, 7, 0, 0]] and lengths.tolist() == [3, 2]
    inputs, targets = inputs_and_targets(tokens, lengths)
    assert inputs.tolist() == [[0, 5, 6], [0, 7, 0]]
    assert targets.tolist() == [[5, 6, 0], [7, 0, IGNORE]]
