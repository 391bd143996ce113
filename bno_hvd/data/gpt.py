"""Language models: ``gpt-mini`` (a small decoder-only transformer) or the user's own.

A text model takes a *padded* token batch: ``tokens`` int64 ``[B, T]``, right-padded to the
longest sequence of the batch (never to a fixed length), and ``lengths`` int64 ``[B]`` (the real
positions of each row). It returns next-token logits ``[B, T, vocab]``. The loss ignores the
padded positions; a causal model needs no mask for them, because position ``j`` attends only to
positions ``<= j``, which are all real when ``j`` is. (A model that is not causal must use
``lengths`` itself.)

``--model`` takes

- ``gpt-mini``: :class:`GPTMini`, pre-norm, 2 layers, 4 heads, width 64, learned positions, tied
  input and output embeddings, no dropout (deterministic, so N ranks can be compared exactly with
  one process): about 0.23M parameters at a vocabulary of 2048, small enough for 4 ranks on 2 cores;
- ``package.module:function``: called with ``vocab_size=V`` and ``max_seq_len=M`` where it takes
  those arguments, returning an ``nn.Module`` whose ``forward(tokens)`` or
  ``forward(tokens, lengths)`` (when it takes two arguments) returns the logits.

Usage::

    model = build_text_model("gpt-mini", vocab_size=2048, max_seq_len=256)
    logits = model(tokens, lengths)
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn

from bno_hvd.common.errors import UsageError
from bno_hvd.data.catalog import TEXT_MODEL_NAMES
from bno_hvd.data.models import load_user_function


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x MLP, each with a residual."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp(self.norm2(x))


class GPTMini(nn.Module):
    """A small causal language model: ``forward(tokens [B, T], lengths=None) -> logits [B, T, vocab]``."""

    def __init__(self, vocab_size: int, max_seq_len: int, width: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.max_seq_len = max_seq_len
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(max_seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() > 1:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.max_seq_len:
            raise ValueError(f"a batch of {t} positions is longer than the model's {self.max_seq_len}")
        x = self.embed(tokens) + self.position(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class TokensOnly(nn.Module):
    """A user's model whose ``forward`` takes the tokens alone."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, tokens, lengths=None):
        return self.net(tokens)


def build_text_model(spec: str, vocab_size: int, max_seq_len: int) -> nn.Module:
    """The language model ``spec`` names, with random weights; always called as ``model(tokens, lengths)``."""
    if spec == "gpt-mini":
        return GPTMini(vocab_size, max_seq_len)
    if ":" not in spec:
        raise UsageError(
            f"--dataset text needs a language model: --model {' or '.join(TEXT_MODEL_NAMES)}, or "
            "package.module:function returning one (see bno_hvd/data/gpt.py)"
        )
    fn, shown = load_user_function(spec)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    kwargs = {k: v for k, v in (("vocab_size", vocab_size), ("max_seq_len", max_seq_len)) if k in params}
    try:
        net = fn(**kwargs)
    except Exception as err:  # noqa: BLE001
        raise UsageError(f"--model {shown}: calling it failed ({type(err).__name__}: {str(err)[:200]})") from None
    if not isinstance(net, nn.Module):
        raise UsageError(f"--model {shown} returned {type(net).__name__}, not a torch.nn.Module")
    return net if _takes_lengths(net) else TokensOnly(net)


def _takes_lengths(net: nn.Module) -> bool:
    try:
        params = list(inspect.signature(net.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)
