"""Same-limit shares read from balanced's updates: which ranks share a limit, and when they split."""

import json

from bno_hvd.lab.profiles import BY_NAME
from bno_hvd.lab.shares import even, report, same_limit_groups


def balanced_log(suite_dir, profile):
    """Where a suite's run of ``balanced`` under ``profile`` writes its updates."""
    runs = suite_dir / profile / "runs" / "balanced"
    runs.mkdir(parents=True)
    return runs / "updates.jsonl"


def test_groups_are_the_ranks_at_one_limit_in_every_phase():
    assert same_limit_groups(BY_NAME["quota-own-10ms"]) == [[0, 1, 2]]  # bno-hvd's own --cpu-quota
    assert same_limit_groups(BY_NAME["outside-two-slow-20ms"]) == [[0, 1], [2, 3]]
    assert same_limit_groups(BY_NAME["outside-equal-10ms"]) == [[0, 1, 2, 3]]
    assert same_limit_groups(BY_NAME["quota-schedule"]) == [[0, 1, 2]]  # rank 3's limit changes
    assert same_limit_groups(BY_NAME["outside-levels-10ms"]) == []
    assert same_limit_groups(BY_NAME["competing-process"]) == []  # no limit: the scheduler decides
    assert same_limit_groups(BY_NAME["emulated-3-levels"]) == []  # EMULATED: no limit at all


def test_one_sample_apart_is_rounding_and_a_rank_that_sits_out_is_not_counted():
    assert even([58, 58, 5, 6], [[0, 1], [2, 3]])  # 5 and 6: more than 10%, but one sample
    assert not even([58, 58, 5, 7], [[0, 1], [2, 3]])
    assert even([43, 42, 43, 0], [[0, 1, 2, 3]])  # rank 3 is out of the allreduce
    assert not even([47, 32, 47, 2], [[0, 1, 2]])


def test_report_counts_even_updates_and_names_the_widest_split(tmp_path):
    splits = [[32] * 4] * 20 + [[42, 43, 42, 1]] * 20 + [[47, 32, 47, 2]] * 40 + [[43, 42, 43, 0]] * 100
    with open(balanced_log(tmp_path, "outside-100ms"), "w") as fh:
        for update, sizes in enumerate(splits):
            fh.write(json.dumps({"update": update, "batch_sizes": sizes}) + "\n")
    balanced_log(tmp_path, "competing-process").write_text("")  # no same-limit ranks: no line
    (tmp_path / "quota-own-10ms").mkdir()  # same-limit ranks, but no balanced run: no line
    assert report(str(tmp_path)) == [
        "outside-100ms (REAL): ranks [[0, 1, 2]] at one limit: within ±10% in 120/160 updates; "
        "widest 1.47: [47, 32, 47, 2] (40 updates from 40 to 79)"
    ]


def test_a_split_is_counted_once_per_update_with_two_groups(tmp_path):
    splits = [[59, 60, 5, 4]] * 20 + [[58, 58, 5, 7]] * 30 + [[60, 58, 5, 5]] * 10
    with open(balanced_log(tmp_path, "outside-two-slow-20ms"), "w") as fh:
        for update, sizes in enumerate(splits):
            fh.write(json.dumps({"update": update, "batch_sizes": sizes}) + "\n")
    assert report(str(tmp_path)) == [
        "outside-two-slow-20ms (REAL): ranks [[0, 1], [2, 3]] at one limit: within ±10% in 10/40 updates; "
        "widest 1.40: [58, 58, 5, 7] (30 updates from 20 to 49)"
    ]
