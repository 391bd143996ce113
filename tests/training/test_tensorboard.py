"""``--tensorboard``: a real multi-rank run's events hold the same numbers as its updates.jsonl and
ranks.json (read back with TensorBoard's own EventAccumulator); a killed run leaves readable events."""

import json

import numpy as np
import pytest
from support.jobs import assert_ok, bno_cmd, horovodrun, run_cli

from bno_hvd.training.results import steps_from_json
from bno_hvd.training.stragglers import straggler_timeline
from bno_hvd.training.tensorboard import MIB, allocation_change

EventAccumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator").EventAccumulator


def events(path):
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(acc, tag):
    return {e.step: e.value for e in acc.Scalars(tag)}


def texts(acc, tag):
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(f"{tag}/text_summary")]


def f32(x):
    """TensorBoard keeps scalars as 32-bit floats."""
    return float(np.float32(x))


def read_updates(log_dir):
    return [json.loads(line) for line in (log_dir / "updates.jsonl").read_text().splitlines()]


def test_allocation_change_text():
    assert allocation_change(0, None, [8, 8]) == "update 0: 8,8 (first update of this run)"
    assert allocation_change(12, [8, 8], [11, 5]) == "update 12: 8,8 -> 11,5"


RANKS = 2  # of the run below: rank 0 gathers the other's steps as it would those of many


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tb")
    # 'random' draws a new split at every rebalance whatever the machine's speed, so the allocation
    # texts are checked on moves that happen also on a busy machine (balanced moves only when it pays)
    args = "--dataset synthetic --updates 30 --base-batch-size 8 --rebalance-every 4 --emulate-speed 1,0.5 "
    args += "--strategy random "
    args += f"--emulate-rate 400 --latency-interval 1 --no-eval --no-progress --log-dir {root / 'log'} "
    args += f"--tensorboard {root / 'tb'}"
    assert_ok(horovodrun(RANKS, bno_cmd("train", *args.split()), timeout=400))
    return events(root / "tb"), read_updates(root / "log"), root / "log"


@pytest.mark.mpi
def test_per_update_values_are_those_of_updates_jsonl(run):
    acc, records, _ = run
    assert [r["update"] for r in records] == list(range(30))
    for tag, key in (
        ("update/loss", "loss"),
        ("update/global_batch", "global_batch"),
        ("update/samples_per_s", "samples_per_s"),
        ("update/weight_update_s", "weight_update_time"),
        ("update/lr", "lr"),
    ):
        assert scalars(acc, tag) == {r["update"]: f32(r[key]) for r in records}, tag
    for rank in range(RANKS):
        assert scalars(acc, f"batch/rank_{rank}") == {r["update"]: r["batch_sizes"][rank] for r in records}
        memory = {r["update"]: f32(r["rank_memory"][rank] / MIB) for r in records if r["rank_memory"]}
        assert sorted(memory) == [3, 7, 11, 15, 19, 23, 27]  # every rebalance
        assert scalars(acc, f"memory_MiB/rank_{rank}") == memory


@pytest.mark.mpi
def test_every_ranks_compute_and_waiting_reach_rank_0(run):
    acc, _, log_dir = run
    steps = steps_from_json(json.loads((log_dir / "ranks.json").read_text()))
    timeline = straggler_timeline(steps)
    for rank in range(RANKS):
        # all 30 updates: the last ones (after the final rebalance) are gathered at the end of the run
        assert scalars(acc, f"compute_s/rank_{rank}") == {u: f32(s.compute) for u, s in enumerate(steps[rank])}
        waited = scalars(acc, f"waited_s/rank_{rank}")
        assert sorted(waited) == list(range(30))
        assert [waited[u] for u in range(30)] == pytest.approx([f32(w) for w in timeline.waited[rank]], abs=1e-7)
    # compute balance and the share outside compute of every update, as bench defines them
    records = read_updates(log_dir)
    compute = np.array([[s.compute for s in steps[rank]] for rank in range(RANKS)])
    balance = compute.mean(axis=0) / compute.max(axis=0)
    assert scalars(acc, "update/compute_balance") == {u: f32(b) for u, b in enumerate(balance)}
    cycles = np.array([r["weight_update_time"] for r in records])
    outside = np.clip(cycles - compute.max(axis=0), 0, None) / cycles
    assert scalars(acc, "update/outside_compute_share") == pytest.approx({u: f32(x) for u, x in enumerate(outside)})
    assert float(np.mean(balance)) == pytest.approx(
        json.loads((log_dir / "result.json").read_text())["compute_balance"]
    )


@pytest.mark.mpi
def test_allocation_changes_and_label_as_text(run):
    acc, records, _ = run
    expected, before = [], None
    for r in records:
        if r["batch_sizes"] != before:
            expected.append((r["update"], allocation_change(r["update"], before, r["batch_sizes"])))
            before = r["batch_sizes"]
    assert len(expected) >= 3, "random draws a new split at every rebalance (7 in 30 updates)"
    assert texts(acc, "allocation") == expected
    assert texts(acc, "heterogeneity") == [(0, "EMULATED heterogeneity: speeds 1,0.5, 400 samples/s at speed 1")]
    (step, run_text) = texts(acc, "run")[0]
    assert step == 0 and json.loads(run_text)["strategy"] == "random" and json.loads(run_text)["ranks"] == RANKS


@pytest.mark.mpi
def test_a_killed_run_leaves_readable_events(tmp_path):
    args = "--dataset synthetic --updates 30 --base-batch-size 8 --rebalance-every 5 --no-eval --no-progress "
    args += f"--latency-interval 1 --log-dir {tmp_path / 'log'} --tensorboard {tmp_path / 'tb'} "
    args += "--inject-fault kill:0:12"  # rank 0 SIGKILLs itself at the start of update 12
    proc = horovodrun(2, bno_cmd("train", *args.split()), timeout=300)
    assert proc.returncode != 0
    acc = events(tmp_path / "tb")
    records = read_updates(tmp_path / "log")
    assert [r["update"] for r in records] == list(range(12))
    assert scalars(acc, "update/loss") == {r["update"]: f32(r["loss"]) for r in records}
    # rank 1's steps reached rank 0 at the rebalances after updates 4 and 9 (those up to 8)
    assert sorted(scalars(acc, "compute_s/rank_1")) == list(range(9))


@pytest.mark.slow
def test_unwritable_tensorboard_dir_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = run_cli("train", "--dry-run", "--dataset", "synthetic", "--tensorboard", str(blocker / "tb"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("bno-hvd: error: --tensorboard") and len(proc.stderr.strip().splitlines()) == 1
