"""Paired comparisons of interleaved rounds (bno_hvd/lab/pairing.py) on numbers with known answers."""

import math

import numpy as np
import pytest

from bno_hvd.lab.pairing import block_rate, comparison, format_comparison, median_interval, paired_ratios, round_orders
from bno_hvd.training.results import UpdateRecord


def test_block_rate_is_samples_over_update_time():
    recs = [
        UpdateRecord(update=u, batch_sizes=[64, 64], global_batch=128, weight_update_time=t, time=0.0)
        for u, t in enumerate([0.2, 0.3])
    ]
    assert block_rate(recs) == pytest.approx(256 / 0.5)
    assert math.isnan(block_rate([]))


def test_each_round_has_its_own_order_drawn_from_the_seed():
    names = ["equal", "balanced", "lbbsp", "fixed"]
    orders = round_orders(names, 6, seed=3)
    assert all(sorted(o) == sorted(names) for o in orders)
    assert len({tuple(o) for o in orders}) > 1  # not one order repeated
    assert orders == round_orders(names, 6, seed=3)  # every rank would draw the same
    assert orders != round_orders(names, 6, seed=4)


def test_ratios_are_paired_within_a_round():
    # round 2 is slow for everyone (a neighbour): the pairs cancel it, the raw rates would not
    rates = {"equal": [100.0, 50.0, 100.0], "balanced": [200.0, 100.0, 210.0]}
    assert paired_ratios(rates, "equal")["balanced"] == pytest.approx([2.0, 2.0, 2.1])
    assert paired_ratios({"equal": [0.0, 10.0], "x": [5.0, 20.0]}, "equal")["x"] == [2.0]  # unknown round dropped


def test_median_interval_brackets_the_median_and_shrinks_with_agreement():
    median, low, high = median_interval([1.0, 2.0, 3.0, 4.0, 5.0], seed=0)
    assert median == 3.0 and 1.0 <= low <= 3.0 <= high <= 5.0
    m2, l2, h2 = median_interval([3.0] * 5, seed=0)
    assert (m2, l2, h2) == (3.0, 3.0, 3.0)
    one = median_interval([2.5])
    assert one[0] == 2.5 and math.isnan(one[1]) and math.isnan(one[2])
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0], seed=0) == (median, low, high)  # seeded


def test_comparison_against_the_best_other_strategy_of_each_round():
    rates = {"equal": [100.0, 100.0], "balanced": [220.0, 180.0], "lbbsp": [200.0, 200.0]}
    table = comparison(rates, "equal", seed=0)
    assert table["balanced"]["ratios"] == pytest.approx([2.2, 1.8])
    assert table["balanced"]["vs_best_peer"][0] == pytest.approx((1.1 + 0.9) / 2)  # 220/200, 180/200
    assert table["lbbsp"]["vs_best_peer"][0] == pytest.approx((200 / 220 + 200 / 180) / 2)
    assert table["equal"]["median"] == 1.0
    text = format_comparison(table, "equal")
    assert "balanced" in text and "2.00 [" in text


def test_the_best_other_of_each_round_is_strict_and_the_top_peer_is_not():
    # seven strategies that run the same split: the same rate, each round's noise its own
    names = ["equal", "balanced", "lbbsp", "proportional", "paramhub", "bno", "fixed"]
    best, top = [], []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        rates = {n: list(100.0 * (1 + 0.05 * rng.standard_normal(8))) for n in names}
        table = comparison(rates, "equal", seed=seed)
        best.append(table["balanced"]["vs_best_peer"][0])
        top.append(table["balanced"]["vs_top_peer"][0])
        assert table["balanced"]["top_peer"] in set(names) - {"balanced"}
    assert np.mean(best) < 0.95  # the maximum of six noisy rates beats the one that is as fast
    assert 0.96 < np.mean(top) < 1.04
    rates = {"equal": [100.0, 100.0], "balanced": [220.0, 180.0], "lbbsp": [200.0, 190.0], "bno": [150.0, 230.0]}
    table = comparison(rates, "equal", seed=0)
    assert table["balanced"]["top_peer"] == "lbbsp"  # median 1.95 x equal against bno's 1.90
    assert table["balanced"]["vs_top_peer"][0] == pytest.approx((220 / 200 + 180 / 190) / 2)
    assert "(lbbsp)" in format_comparison(table, "equal")
