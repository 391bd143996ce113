import pytest
import torch

from bno_hvd.allocation.weighting import (
    gradient_reduction,
    keeps_batches_even,
    rank_weight,
    sample_weights,
    scaled_lr,
)
from bno_hvd.common.errors import UsageError


def test_weights_are_sample_shares():
    assert sample_weights([5, 11, 3, 13]) == [5 / 32, 11 / 32, 3 / 32, 13 / 32]
    assert rank_weight([1, 3], 1) == 0.75


def test_weighted_sum_of_local_means_is_the_global_mean():
    torch.manual_seed(0)
    sizes = [5, 11, 3, 13]
    parts = [torch.randn(n, 7, dtype=torch.float64) for n in sizes]
    weighted = sum(w * p.mean(0) for w, p in zip(sample_weights(sizes), parts))
    assert torch.allclose(weighted, torch.cat(parts).mean(0), rtol=0, atol=1e-14)


def test_bad_sizes_rejected():
    with pytest.raises(ValueError):
        sample_weights([0, 0])
    with pytest.raises(ValueError):
        sample_weights([2, -1])


def test_linear_lr_scaling():
    assert scaled_lr(0.1, 256, 4, 32) == pytest.approx(0.2)
    assert scaled_lr(0.1, 256, 4, 32, "none") == 0.1
    with pytest.raises(ValueError):
        scaled_lr(0.1, 256, 4, 32, "sqrt")


def test_the_users_op_becomes_a_weighted_or_plain_sum_and_what_cannot_be_exact_is_refused():
    assert gradient_reduction("average", even=False) == ("sum", True)  # the sample-weighted mean
    assert gradient_reduction("sum", even=False) == ("sum", False)  # losses that sum over samples
    assert gradient_reduction("adasum", even=True) == ("adasum", False)
    with pytest.raises(UsageError, match="Adasum cannot give the sample-weighted mean of uneven batches"):
        gradient_reduction("adasum", even=False)
    with pytest.raises(UsageError, match="gradient_predivide_factor=2: .* drop it"):
        gradient_reduction("average", even=True, predivide=2.0)
    with pytest.raises(UsageError, match="op=min"):
        gradient_reduction("min", even=True)
    assert keeps_batches_even("equal", [32, 32, 32]) and keeps_batches_even("fixed", [8, 8])
    assert not keeps_batches_even("fixed", [8, 9]) and not keeps_batches_even("random", [8, 8])
