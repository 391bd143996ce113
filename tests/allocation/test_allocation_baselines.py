"""Baselines (equal, random, fixed, proportional, paramhub, lbbsp) and make_strategy validation."""

import json

import pytest

from bno_hvd.allocation import STRATEGY_NAMES, ClusterMetrics, UsageError, make_strategy

LAT = [[0.0] * 4 for _ in range(4)]


def metrics(ops, max_batch=()):
    return ClusterMetrics(ops=list(ops), memory_used=[1.0] * 4, latency=LAT, max_batch=list(max_batch))


def test_make_strategy_unknown_name_lists_valid_names():
    with pytest.raises(UsageError) as err:
        make_strategy("fastest", 4, 32)
    assert "fastest" in str(err.value)
    assert "bno, balanced, equal, random, fixed, proportional, lbbsp, paramhub" in str(err.value)


@pytest.mark.parametrize("name", [n for n in STRATEGY_NAMES if n != "fixed"])
def test_every_strategy_builds_and_starts_valid(name):
    s = make_strategy(name, 4, 32, seed=3)
    sizes = s.initial()
    assert len(sizes) == 4 and all(b >= 1 for b in sizes)
    assert sum(sizes) == 128
    json.dumps(s.state_dict())
    assert s.changes_global_batch is (name == "bno")


def test_make_strategy_rejects_bad_arguments():
    with pytest.raises(UsageError, match="number of ranks"):
        make_strategy("equal", 0, 32)
    with pytest.raises(UsageError, match="batch-size"):
        make_strategy("equal", 4, 0)
    with pytest.raises(UsageError, match="only applies to --strategy fixed"):
        make_strategy("equal", 4, 32, batch_sizes=[1, 2, 3, 4])
    with pytest.raises(UsageError, match="has no option"):
        make_strategy("equal", 4, 32, deadband=0.1)


def test_equal_always_gives_b():
    s = make_strategy("equal", 4, 32)
    assert s.rebalance(metrics([1, 2, 3, 400]), [10, 20, 30, 68], 5) == [32] * 4
    with pytest.raises(UsageError, match="global"):
        make_strategy("equal", 4, 32, global_batch=100)


def test_random_is_seeded_deterministic_and_sums_to_global():
    a = make_strategy("random", 4, 32, seed=7)
    b = make_strategy("random", 4, 32, seed=7)
    c = make_strategy("random", 4, 32, seed=8)
    m = metrics([1, 1, 1, 1])
    assert a.initial() == b.initial()
    draws = [a.rebalance(m, [32] * 4, u) for u in (10, 20, 30)]
    assert draws == [b.rebalance(m, [32] * 4, u) for u in (10, 20, 30)]
    assert len({tuple(d) for d in draws}) == 3  # a new split each rebalance
    assert draws != [c.rebalance(m, [32] * 4, u) for u in (10, 20, 30)]
    assert all(sum(d) == 128 and min(d) >= 1 for d in draws)


def test_random_respects_global_batch_and_caps_do_not_bound_it():
    s = make_strategy("random", 4, 32, global_batch=20)
    got = s.rebalance(metrics([1] * 4, max_batch=[5, 5, 5, 5]), [5] * 4, 1)
    assert sum(got) == 20 and min(got) >= 1
    # the same draw with or without caps: a share above a cap is processed in micro-batches
    assert got == make_strategy("random", 4, 32, global_batch=20).rebalance(metrics([1] * 4), [5] * 4, 1)


def test_fixed_validates_and_never_changes():
    with pytest.raises(UsageError, match="one size per rank"):
        make_strategy("fixed", 4, 32, batch_sizes=[10, 20, 30])
    with pytest.raises(UsageError, match="one size per rank"):
        make_strategy("fixed", 4, 32)
    with pytest.raises(UsageError, match="rank 0's >= 1"):
        make_strategy("fixed", 4, 32, batch_sizes=[0, 10, 30, 40])
    with pytest.raises(UsageError, match=">= 0"):
        make_strategy("fixed", 4, 32, batch_sizes=[10, -1, 30, 40])
    # a rank at 0 sits out, where the loop or a drop-in lets it (the Balancer checks: test_dropin_sitout.py)
    assert make_strategy("fixed", 4, 8, batch_sizes=[8, 8, 0, 0]).initial() == [8, 8, 0, 0]
    with pytest.raises(UsageError, match="disagrees"):
        make_strategy("fixed", 4, 32, batch_sizes=[10, 20, 30, 40], global_batch=128)
    s = make_strategy("fixed", 4, 32, batch_sizes=[10, 20, 30, 40])
    assert s.initial() == [10, 20, 30, 40] and s.global_batch == 100
    assert s.rebalance(metrics([1, 1, 1, 1]), [25] * 4, 3) == [10, 20, 30, 40]
    # a size above a rank's memory cap is fine: that rank accumulates micro-batches
    assert s.rebalance(metrics([1, 1, 1, 1], max_batch=[None, None, None, 16]), [25] * 4, 4) == [10, 20, 30, 40]
    assert s.last_warning is None


def test_fixed_takes_its_split_in_its_name_on_every_path():
    """``fixed:8,4,2,2`` (a script's ``--strategy``, Lightning's, the Trainer's: all build through make_strategy)."""
    assert make_strategy("fixed:8,4,2,2", 4, 4).initial() == [8, 4, 2, 2]
    assert make_strategy(" fixed:8, 8,0,0", 4, 4).initial() == [8, 8, 0, 0]
    assert make_strategy("fixed:8,4,2,2", 4, 4, batch_sizes=[8, 4, 2, 2]).initial() == [8, 4, 2, 2]
    with pytest.raises(UsageError, match="given twice: fixed:8,4,2,2 and batch_sizes=\\[4, 4, 4, 4\\]"):
        make_strategy("fixed:8,4,2,2", 4, 4, batch_sizes=[4, 4, 4, 4])
    with pytest.raises(UsageError, match="one size per rank"):
        make_strategy("fixed:8,4,2", 4, 4)
    with pytest.raises(UsageError, match="takes no options; give its split as fixed:8,4,2,2"):
        make_strategy("fixed:deadband=0.1", 4, 4)
    with pytest.raises(UsageError, match="name=value"):
        make_strategy("fixed:8,4,2,2:9", 4, 4)


def test_proportional_freezes_after_first_measurement():
    s = make_strategy("proportional", 4, 25)
    assert s.initial() == [25] * 4
    first = s.rebalance(metrics([300, 300, 300, 100]), [25] * 4, 1)
    assert first == [30, 30, 30, 10]
    assert s.rebalance(metrics([100, 100, 100, 100]), first, 2) == [30, 30, 30, 10]
    t = make_strategy("proportional", 4, 25)
    t.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert t.rebalance(metrics([1, 1, 1, 1]), [25] * 4, 3) == [30, 30, 30, 10]


def test_proportional_waits_for_complete_measurement():
    s = make_strategy("proportional", 4, 25)
    assert s.rebalance(metrics([300, None, 300, 100]), [25] * 4, 1) == [25] * 4
    assert "rank(s) [1]" in s.last_warning
    assert s.rebalance(metrics([300, 300, 300, 100]), [25] * 4, 2) == [30, 30, 30, 10]


def test_paramhub_rebalances_once_after_warmup():
    s = make_strategy("paramhub", 4, 25, paramhub_after=5)
    assert s.rebalance(metrics([300, 300, 300, 100]), [25] * 4, 4) == [25] * 4  # still warming up
    assert s.rebalance(metrics([300, 300, 300, 100]), [25] * 4, 5) == [30, 30, 30, 10]
    assert s.rebalance(metrics([100, 300, 300, 300]), [30, 30, 30, 10], 10) == [30, 30, 30, 10]
    with pytest.raises(UsageError, match="paramhub_after"):
        make_strategy("paramhub", 4, 25, paramhub_after=-1)


def test_lbbsp_tracks_changes_with_smoothing():
    s = make_strategy("lbbsp", 4, 25, alpha=0.5)
    assert s.rebalance(metrics([300, 300, 300, 100]), [25] * 4, 1) == [30, 30, 30, 10]
    # Rank 3 speeds up to 500: prediction 0.5*500 + 0.5*100 = 300 -> equal split.
    assert s.rebalance(metrics([300, 300, 300, 500]), [30, 30, 30, 10], 2) == [25] * 4
    # Prediction 400 vs 300: 100 * [3, 3, 3, 4]/13 = 23.08 x3, 30.77 -> [23, 23, 23, 31].
    assert s.rebalance(metrics([300, 300, 300, 500]), [25] * 4, 3) == [23, 23, 23, 31]


def test_lbbsp_missing_rank_uses_last_prediction():
    s = make_strategy("lbbsp", 4, 25, alpha=1.0)
    s.rebalance(metrics([300, 300, 300, 100]), [25] * 4, 1)
    assert s.rebalance(metrics([300, 300, 300, None]), [30, 30, 30, 10], 2) == [30, 30, 30, 10]
    assert "rank(s) [3]" in s.last_warning
    with pytest.raises(UsageError, match="alpha"):
        make_strategy("lbbsp", 4, 25, alpha=0.0)


def test_rebalance_checks_sizes():
    s = make_strategy("equal", 4, 32)
    with pytest.raises(UsageError, match="describe 3 ranks"):
        s.rebalance(ClusterMetrics([1] * 3, [1] * 3, [[0] * 3] * 3), [32] * 4, 1)
    with pytest.raises(UsageError, match="ints >= 1"):
        s.rebalance(metrics([1] * 4), [32, 32, 32, 0], 1)


def test_a_strategy_spec_carries_its_options():
    from bno_hvd.allocation import check_spec, make_strategy, split_spec

    assert split_spec("balanced:deadband=0.1:sit_out=0:noise_sigmas=none") == (
        "balanced",
        {"deadband": 0.1, "sit_out": 0, "noise_sigmas": None},
    )
    assert split_spec("equal") == ("equal", {})
    strategy = make_strategy("balanced:deadband=0.2", 4, 32)
    assert strategy.options["deadband"] == 0.2 and strategy.name == "balanced"
    for bad, words in [
        ("nope:x=1", "unknown strategy 'nope'"),
        ("balanced:deadband", "name=value"),
        ("fixed:x=1", "takes no options"),
    ]:
        with pytest.raises(UsageError, match=words):
            split_spec(bad)
    with pytest.raises(UsageError, match="no option 'dedband'"):
        make_strategy("balanced:dedband=1", 4, 32)
    with pytest.raises(UsageError, match="deadband must be in"):
        check_spec("balanced:deadband=2")
    assert check_spec("fixed") == "fixed" and check_spec("balanced:deadband=0.2") == "balanced:deadband=0.2"


def test_only_a_rank_but_0_may_have_no_samples_and_only_where_the_runtime_lets_it():
    from bno_hvd.allocation.strategy import valid_sizes

    assert valid_sizes([40, 44, 44, 0], 4, sit_out_ok=True)
    assert not valid_sizes([40, 44, 44, 0], 4)  # a user's loop: every rank computes
    assert not valid_sizes([0, 44, 44, 40], 4, sit_out_ok=True)  # rank 0 writes logs and checkpoints
    assert valid_sizes([128, 0, 0, 0], 4, sit_out_ok=True)  # several at once: rank 0 computes
    assert not valid_sizes([64, 64, 0, 0], 4)
    assert not valid_sizes([64, 64, -1, 1], 4, sit_out_ok=True) and not valid_sizes([64, 64], 4)
