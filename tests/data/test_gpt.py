"""The language models: gpt-mini is causal (padding never changes a real position, float64 exact),
trains, and user models get the token batch."""

import sys

import pytest
import torch
import torch.nn.functional as F

from bno_hvd.common.errors import UsageError
from bno_hvd.data.gpt import GPTMini, build_text_model
from bno_hvd.data.tokens import IGNORE, collate_tokens, inputs_and_targets

torch.set_num_threads(1)

USER_MODELS = """
import torch
from torch import nn

class Bigram(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)

    def forward(self, tokens):
        return self.table(tokens)

def bigram(vocab_size):
    return Bigram(vocab_size)

def not_a_module():
    return 3
"""


def test_padding_does_not_change_real_positions_in_float64():
    torch.manual_seed(0)
    model = GPTMini(300, 32).double()
    seqs = [torch.randint(0, 300, (n + 1,)) for n in (3, 17, 9)]
    tokens, lengths = collate_tokens(seqs)
    inputs, _ = inputs_and_targets(tokens, lengths)
    padded = model(inputs, lengths)
    for row, s in enumerate(seqs):
        alone = model(s[None, :-1], lengths[row : row + 1])
        assert (padded[row, : len(s) - 1] - alone[0]).abs().max() < 1e-12


def test_gpt_mini_learns_a_repeated_sequence():
    torch.manual_seed(0)
    model = GPTMini(64, 16)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    tokens, lengths = collate_tokens([torch.arange(10) % 5, torch.arange(7) % 5])
    inputs, targets = inputs_and_targets(tokens, lengths)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        logits = model(inputs, lengths)
        loss = F.cross_entropy(logits.reshape(-1, 64), targets.reshape(-1), ignore_index=IGNORE)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]
    assert sum(p.numel() for p in GPTMini(2048, 256).parameters()) < 300_000  # sized for 4 ranks on 2 cores


def test_user_language_models(tmp_path, monkeypatch):
    (tmp_path / "bno_user_lm.py").write_text(USER_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = build_text_model("bno_user_lm:bigram", vocab_size=50, max_seq_len=8)
    logits = model(torch.zeros(2, 5, dtype=torch.int64), torch.tensor([5, 3]))  # lengths not passed on
    assert logits.shape == (2, 5, 50)
    with pytest.raises(UsageError, match="returned int, not a torch.nn.Module"):
        build_text_model("bno_user_lm:not_a_module", 50, 8)
    with pytest.raises(UsageError, match="--dataset text needs a language model"):
        build_text_model("cnn", 50, 8)
    sys.modules.pop("bno_user_lm", None)
