"""Micro-batches under a cap in padded tokens (count x longest), and their token shares."""

import pytest

from bno_hvd.allocation.microbatch import token_parts, token_shares


@pytest.mark.parametrize(
    "lengths,cap,parts",
    [
        ([3, 5, 8, 8, 20], 24, [(0, 3), (3, 4), (4, 5)]),
        ([1] * 10, 4, [(0, 4), (4, 8), (8, 10)]),
        ([5, 6], None, [(0, 2)]),
        ([7], 7, [(0, 1)]),
        ([2, 2, 2, 9], 9, [(0, 3), (3, 4)]),
    ],
)
def test_parts_fit_the_cap(lengths, cap, parts):
    assert token_parts(lengths, cap) == parts
    for a, b in parts:
        assert cap is None or (b - a) * max(lengths[a:b]) <= cap


def test_shares_are_token_shares():
    lengths = [3, 5, 8, 8, 20]
    shares = token_shares(lengths, token_parts(lengths, 24))
    assert shares == pytest.approx([16 / 44, 8 / 44, 20 / 44]) and sum(shares) == pytest.approx(1.0)
