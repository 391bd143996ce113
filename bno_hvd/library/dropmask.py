"""Dropout masks that are pure functions of (seed, epoch, sample, call, element).

Counter-based, as Philox is: no generator state, so a mask row is the same whatever batch, rank
or device it is computed in, and a whole batch's masks are a few integer operations.

- a row's key: :func:`dropout_seed` ``(seed, epoch, index, call)``, 63 bits: the sample's seed
  ``sample_seed(seed, epoch, index)`` XOR a key per call;
- its terms (:func:`row_terms`): a multiplier ``m`` (the key's low 31 bits, made odd) and an
  offset ``c`` (its high 31 bits);
- element ``j``: ``bits = lowbias32((j * m + c) mod 2**32)``, kept where ``bits / 2**32 >= p``.

lowbias32 is C. Wellons' 32-bit integer hash (hash-prospector): ``x ^= x >> 16; x *= 0x7feb352d;
x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16``, all modulo 2**32; on ``j * m + c`` it is
SplitMix's construction (a Weyl sequence through a finaliser), with a step per row.

The same integers two ways, tested equal bit for bit: :func:`mask_bits` in int64 torch operations
on any device (every product exact: a value below 2**32 times a constant of magnitude at most
2**31), and :func:`mask_bits_numpy` in numpy's uint32 arithmetic, which wraps modulo 2**32 by
definition, for a CPU tensor: on these small arrays a numpy operation costs a fraction of a torch
one (measured on the example's Net: 3% of a training step less, ``benchmarks/dropout_cost.py``).

Usage::

    terms = row_terms(sample_seeds(seed, keys)) ^ call_terms(call)   # (2, rows, 1): dropout_seed's
    keep = keep_mask(terms, shape, p, x.device)                       # (rows, *shape) booleans
    scale = scaled_mask(terms, shape, p, x)                           # x * scale: the dropout
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from bno_hvd.common.errors import UsageError
from bno_hvd.library.loader import sample_seed

_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # sample_seed's
_LOW32 = 0xFFFFFFFF
# lowbias32's multipliers; for torch the second as a signed 32-bit number, whose product with a
# value below 2**32 stays inside int64 and has the unsigned product's low 32 bits
_MUL1, _MUL2 = 0x7FEB352D, 0x846CA68B
_MUL2_SIGNED = _MUL2 - 2**32


def dropout_seed(seed: int, epoch: int, index: int, call: int) -> int:
    """The 63-bit key of sample ``index``'s mask at the ``call``-th dropout of a forward, in
    ``epoch``: the sample's seed ``sample_seed(seed, epoch, index)`` XOR one key per call."""
    return sample_seed(seed, epoch, index) ^ _call_key(call)


def _call_key(call: int) -> int:
    return sample_seed(0x5EED, call + 1, 0)


def sample_seeds(seed: int, keys) -> np.ndarray:
    """``sample_seed(seed, epoch, index)`` of every ``(epoch, index)`` in ``keys`` at once, as
    int64: the same splitmix64 in uint64 arrays, whose products wrap modulo 2**64 as its
    ``% 2**64`` does."""
    epochs, indices = np.array(keys, np.uint64).reshape(-1, 2).T
    z = np.uint64(seed * _GOLDEN % 2**64) + epochs * _MIX1 + indices * _MIX2
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    return ((z ^ (z >> np.uint64(31))) >> np.uint64(1)).view(np.int64)


def row_terms(row_keys: np.ndarray) -> np.ndarray:
    """``(2, rows, 1)`` int64: each row's multiplier (its key's low 31 bits, made odd) and offset
    (its high 31 bits). The terms of ``key ^ k`` are those of ``key`` XOR those of ``k`` less the
    multiplier's lowest bit, which is how :func:`call_terms` turns a sample's into a call's."""
    return np.stack((row_keys & 0x7FFFFFFF | 1, row_keys >> 32))[:, :, None]


@functools.cache
def call_terms(call: int) -> np.ndarray:
    """``(2, 1, 1)`` int64: XOR a sample's :func:`row_terms` with it, and they are the terms of
    its key at the ``call``-th dropout, ``dropout_seed(seed, epoch, index, call)``."""
    key = _call_key(call)
    terms = np.array([key & 0x7FFFFFFE, key >> 32], np.int64)[:, None, None]
    terms.flags.writeable = False  # one array per call, shared by every caller
    return terms


def keep_mask(terms: np.ndarray, shape: tuple, p: float, device: torch.device) -> torch.Tensor:
    """``(rows, *shape)`` booleans on ``device``, each True with probability 1 - p
    (``bits / 2**32 >= p``), for the rows of :func:`row_terms` ``terms``; element ``j`` of a row is
    its ``j``-th in row-major order."""
    n, threshold = _size_and_threshold(shape, p)
    if device.type == "cpu":
        return torch.from_numpy(mask_bits_numpy(terms, n).reshape(-1, *shape) >= threshold)
    return (mask_bits(torch.from_numpy(terms).to(device), n) >= threshold).view(-1, *shape)


_NUMPY_FLOATS = {torch.float32: np.float32, torch.float64: np.float64}  # scaled_mask's numpy path


def scaled_mask(terms: np.ndarray, shape: tuple, p: float, like: torch.Tensor) -> torch.Tensor:
    """What a dropout multiplies by: :func:`keep_mask` in ``like``'s dtype and device, its kept
    elements ``1 / (1 - p)``. For a float32 or float64 tensor on the CPU, one numpy product of the
    mask and the scale instead of torch's conversion and product (the same values)."""
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    kind = _NUMPY_FLOATS.get(like.dtype) if like.device.type == "cpu" else None
    if kind is None:
        return keep_mask(terms, shape, p, like.device).to(like.dtype).mul_(scale)
    n, threshold = _size_and_threshold(shape, p)
    return torch.from_numpy(((mask_bits_numpy(terms, n) >= threshold) * kind(scale)).reshape(-1, *shape))


def _size_and_threshold(shape: tuple, p: float) -> tuple[int, int]:
    n = math.prod(shape)
    if n >= 2**32:
        raise UsageError(f"exact_dropout: a mask row of {n} elements; at most 2**32 - 1 per sample")
    return n, math.ceil(p * 2**32)


def mask_bits(terms: torch.Tensor, n: int) -> torch.Tensor:
    """32 random bits per (row, element): ``(rows, n)`` int64 in [0, 2**32) on ``terms``' device,
    lowbias32((j * m + c) mod 2**32); ``m < 2**31`` keeps ``j * m`` inside int64."""
    j = torch.arange(n, dtype=torch.int64, device=terms.device)
    a = torch.addcmul(terms[1], j, terms[0]).bitwise_and_(_LOW32)
    a.bitwise_xor_(a >> 16).mul_(_MUL1).bitwise_and_(_LOW32)
    a.bitwise_xor_(a >> 15).mul_(_MUL2_SIGNED).bitwise_and_(_LOW32)
    return a.bitwise_xor_(a >> 16)


def mask_bits_numpy(terms: np.ndarray, n: int) -> np.ndarray:
    """:func:`mask_bits` in numpy, as uint32 (whose arithmetic is modulo 2**32)."""
    multiplier, offset = terms.astype(np.uint32)
    a = np.arange(n, dtype=np.uint32) * multiplier + offset
    a ^= a >> np.uint32(16)
    a *= np.uint32(_MUL1)
    a ^= a >> np.uint32(15)
    a *= np.uint32(_MUL2)
    a ^= a >> np.uint32(16)
    return a
