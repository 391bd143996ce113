"""Exact dropout's masks (bno_hvd/library/dropmask.py) alone, no process: the keys are loader's
seeds, the torch and numpy bits are lowbias32 and equal, each element is kept with probability
1 - p, and masks of other samples, calls, epochs or elements agree no more than independent
draws would. Every bound is 5 standard deviations of the binomial (the hash is deterministic: a
test that passes once passes always)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bno_hvd.common.errors import UsageError
from bno_hvd.library.dropmask import (
    call_terms,
    dropout_seed,
    keep_mask,
    mask_bits,
    mask_bits_numpy,
    row_terms,
    sample_seeds,
    scaled_mask,
)
from bno_hvd.library.dropout import SampleDropout
from bno_hvd.library.loader import sample_seed

CPU = torch.device("cpu")


def lowbias32(x: int) -> int:
    """C. Wellons' hash as published, in Python integers."""
    x ^= x >> 16
    x = x * 0x7FEB352D % 2**32
    x ^= x >> 15
    x = x * 0x846CA68B % 2**32
    return x ^ (x >> 16)


def keys_of(seed, keys, call):
    return row_terms(np.array([dropout_seed(seed, e, i, call) for e, i in keys], np.int64))


def within(rate, expected, count, z=5.0):
    return abs(rate - expected) <= z * math.sqrt(expected * (1 - expected) / count)


def test_the_keys_are_the_loaders_seeds_and_a_call_is_a_xor():
    keys = [(0, 0), (0, 1), (3, 59999), (2**20, 2**31 - 1), (7, 12345)]
    for seed in (0, 1, 42, 2**63 - 1):
        seeds = sample_seeds(seed, keys)
        assert seeds.tolist() == [sample_seed(seed, e, i) for e, i in keys]
        for call in (0, 1, 9):
            assert np.array_equal(row_terms(seeds) ^ call_terms(call), keys_of(seed, keys, call))
    assert len({dropout_seed(0, 0, 5, call) for call in range(100)}) == 100


def test_the_bits_are_lowbias32_in_torch_and_in_numpy_alike():
    rng = np.random.default_rng(0)
    row_keys = np.concatenate([rng.integers(0, 2**63, 200, dtype=np.int64), [0, 2**63 - 1, 2**31 - 1, 2**32]])
    terms = row_terms(row_keys)
    for n in (1, 7, 4096):
        bits = mask_bits(torch.from_numpy(terms), n)
        assert bits.dtype == torch.int64 and bits.shape == (len(row_keys), n)
        assert np.array_equal(bits.numpy(), mask_bits_numpy(terms, n).astype(np.int64))
    m, c = (int(v) for v in terms[:, -1, 0])
    expected = [lowbias32((j * m + c) % 2**32) for j in range(7)]
    assert mask_bits(torch.from_numpy(terms[:, -1:]), 7)[0].tolist() == expected
    assert mask_bits_numpy(terms[:, -1:], 7)[0].tolist() == expected
    # a GPU's path (torch on the device, the terms copied there: no mask is) runs through on "meta"
    assert keep_mask(terms, (9,), 0.5, torch.device("meta")).shape == (len(row_keys), 9)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9, 0.999])
def test_an_element_is_kept_with_probability_one_minus_p(p):
    terms = keys_of(3, [(0, i) for i in range(2000)], 0)
    keep = keep_mask(terms, (500,), p, CPU)
    assert keep.dtype == torch.bool and keep.shape == (2000, 500)
    assert within(keep.double().mean().item(), 1 - p, keep.numel())
    # and in every row alike, not on average over them: rows' means vary as binomial ones, p(1-p)/n
    # (the variance of 2000 of them is known to sqrt(2/1999) = 3%: 6 of those)
    assert abs(keep.double().mean(1).var().item() / (p * (1 - p) / 500) - 1) < 0.19


def test_p_one_keeps_nothing_and_a_tiny_p_keeps_nearly_all():
    terms = keys_of(0, [(0, i) for i in range(64)], 0)
    assert not keep_mask(terms, (100,), 1.0, CPU).any()
    assert keep_mask(terms, (100,), 1e-9, CPU).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("p", [0.25, 0.5, 1.0])
def test_the_scaled_mask_is_the_mask_times_its_scale_bit_for_bit(dtype, p):
    # numpy's product on the CPU for float32/64, torch's conversion and product otherwise: the same values
    terms = keys_of(4, [(0, i) for i in range(16)], 1)
    scale = scaled_mask(terms, (3, 5), p, torch.zeros(1, dtype=dtype))
    expected = keep_mask(terms, (3, 5), p, CPU).to(dtype) * (1.0 / (1.0 - p) if p < 1 else 0.0)
    assert scale.dtype == dtype and scale.shape == (16, 3, 5) and torch.equal(scale, expected)
    assert p == 1.0 or (scale != 0).any()


def agreement(a, b):
    return (a == b).double().mean().item()


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_other_samples_calls_epochs_and_elements_draw_independently(p):
    expected, n = p * p + (1 - p) ** 2, 400  # two independent draws agree this often
    samples = [(0, i) for i in range(1500)]
    keep = keep_mask(keys_of(9, samples, 0), (n,), p, CPU)
    count = (len(samples) - 1) * n
    assert within(agreement(keep[1:], keep[:-1]), expected, count)  # neighbouring sample indices
    assert within(agreement(keep[:, 1:], keep[:, :-1]), expected, len(samples) * (n - 1))  # neighbouring elements
    next_call = keep_mask(keys_of(9, samples, 1), (n,), p, CPU)
    assert within(agreement(keep, next_call), expected, keep.numel())
    next_epoch = keep_mask(keys_of(9, [(1, i) for _, i in samples], 0), (n,), p, CPU)
    assert within(agreement(keep, next_epoch), expected, keep.numel())
    other_seed = keep_mask(keys_of(10, samples, 0), (n,), p, CPU)
    assert within(agreement(keep, other_seed), expected, keep.numel())
    # and no two rows alike: each row's agreement with its neighbour is that of independent rows too
    per_row = (keep[1:] == keep[:-1]).double().mean(1)
    assert (per_row - expected).abs().max().item() <= 6 * math.sqrt(expected * (1 - expected) / n)


def test_a_row_is_the_same_in_any_batch():
    samples = [(0, 11), (0, 4), (1, 7), (1, 0), (0, 9), (2, 3)]
    whole = keep_mask(keys_of(5, samples, 2), (300,), 0.5, CPU)
    for part in ([2], [0, 5], [5, 4, 3, 2, 1, 0]):
        assert torch.equal(keep_mask(keys_of(5, [samples[i] for i in part], 2), (300,), 0.5, CPU), whole[part])


def test_a_row_longer_than_the_counter_is_refused_in_one_line():
    with pytest.raises(UsageError, match="at most 2\\*\\*32 - 1 per sample"):
        keep_mask(keys_of(0, [(0, 1)], 0), (2**16, 2**16), 0.5, CPU)


def test_sample_dropout_draws_the_rows_of_dropout_seed_channel_wise_and_in_place():
    keys, seed = [(0, 3), (1, 8), (4, 2)], 7
    mode = SampleDropout(lambda: keys, seed)
    x = torch.ones(3, 6, 5, dtype=torch.float64)
    with mode:
        flat = F.dropout(x, p=0.4)
        channels = F.dropout1d(x, 0.4, True)
        y = x.clone()
        same = F.dropout(y, 0.4, True, True)
    assert torch.equal(flat != 0, keep_mask(keys_of(seed, keys, 0), (6, 5), 0.4, CPU))
    assert torch.equal((channels != 0)[:, :, :1], keep_mask(keys_of(seed, keys, 1), (6, 1), 0.4, CPU))
    assert torch.equal(channels, channels[:, :, :1].expand_as(channels))  # one draw per channel
    assert torch.equal(flat[flat != 0], torch.full_like(flat[flat != 0], 1 / 0.6))
    assert same is y and torch.equal(y != 0, keep_mask(keys_of(seed, keys, 2), (6, 5), 0.4, CPU))
    volume = x[..., None, None]
    with mode:  # p = 0 and training=False: torch's own dropout, the identity; no call counted
        mode.calls = 0
        assert torch.equal(F.dropout(x, 0.0), x) and torch.equal(F.dropout3d(volume, 0.5, False), volume)
        planes = F.dropout2d(x[..., None], 0.4)
    assert torch.equal((planes != 0)[:, :, :1, :1], keep_mask(keys_of(seed, keys, 0), (6, 1, 1), 0.4, CPU))
