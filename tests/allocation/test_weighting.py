import pytest
import torch

from bno_hvd.allocation.weighting import rank_weight, sample_weights, scaled_lr


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
