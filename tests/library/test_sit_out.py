"""A rank that sits out and comes back (``balanced``'s ``sit_out``, :mod:`bno_hvd.library.catchup`):
real Horovod process sets (and torch.distributed groups with ``--engine torch``), the real
DataLoader with its empty batches, real Fashion-MNIST.

Rank 3 is an EMULATED device at 2% of the others' speed until update 15, then as fast: one of
its samples takes longer than the other ranks' whole update, so ``balanced`` lets it sit out
(whatever the machine's load: the gap is 5x), measures it again after ``sit_out=1`` rebalance
out, and takes it back once it is fast. The parameters after 30 updates (Adam, float64: its
moments travel with the state a returning rank receives) must be those of one process on the
same global batches."""

import json

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import assert_ok, bno_cmd, horovodrun, mpirun, run_cli

# outcome depends on speed (a rank 5x slower sits out): runs alone, one test after another (tiers.py)
pytestmark = [pytest.mark.mpi, pytest.mark.alone]

COMMON = ("--updates", "30", "--optimizer", "adam", "--dtype", "float64", "--lr", "0.01", "--seed", "5")
COMMON += ("--base-batch-size", "8", "--no-eval", "--no-progress", "--latency-interval", "0")


@pytest.fixture(scope="module")
def single(tmp_path_factory, fashion_dir):
    """One plain process on the same 32-sample global batches (no launcher to start)."""
    path = tmp_path_factory.mktemp("single") / "single.pt"
    solo = ["train", "--data-dir", fashion_dir, "--strategy", "fixed", "--batch-sizes", "32", "--save-model", str(path)]
    solo += COMMON
    solo[solo.index("--base-batch-size") + 1] = "32"
    assert_ok(run_cli(*solo, timeout=300))
    return torch.load(path, weights_only=True)


def emulated_run(tmp_path, fashion_dir, speeds, *extra, sit_out=1):
    """``bno-hvd train`` of 4 ranks under EMULATED speeds that change (``speeds``: the schedule),
    ``balanced`` rebalancing every 3 updates and a rank out measured again after ``sit_out`` rebalances."""
    schedule = tmp_path / "speeds.json"
    schedule.write_text(json.dumps(speeds))
    args = ["train", "--data-dir", fashion_dir, "--strategy", f"balanced:sit_out={sit_out}", "--rebalance-every", "3"]
    args += ["--emulate-schedule", str(schedule), "--emulate-rate", "200"]  # 5 ms a sample at speed 1, 250 at 2%
    args += ["--num-workers", "1", "--log-dir", str(tmp_path / "multi"), "--save-model", str(tmp_path / "multi.pt")]
    return bno_cmd(*args, *COMMON, *extra)


@pytest.mark.parametrize("engine", ["horovod", "torch"])
def test_a_rank_sits_out_comes_back_and_training_stays_exact(engine, tmp_path, single, fashion_dir):
    speeds = [{"update": 0, "speeds": [1, 1, 1, 0.02]}, {"update": 15, "speeds": [1] * 4}]
    args = emulated_run(tmp_path, fashion_dir, speeds, "--engine", engine)
    multi = tmp_path / "multi"
    assert_ok(horovodrun(4, args, timeout=400) if engine == "horovod" else mpirun(4, args, timeout=400))
    records = [json.loads(line) for line in open(multi / "updates.jsonl")]
    sizes = [r["batch_sizes"] for r in records if "batch_sizes" in r]
    notes = [r["rebalance_note"] for r in records if r.get("rebalance_note")]
    out = [u for u, s in enumerate(sizes) if s[3] == 0]
    assert out and out[0] < 15, sizes  # it sat out while it was slow
    assert all(sum(s) == 32 and s[0] > 0 for s in sizes), sizes  # the global batch; rank 0 never sits out
    assert any(n.startswith("rank 3 sits out:") for n in notes), notes
    # ranks 1 and 2 run at full speed, but beside the suite's jobs one may get too little of the CPU
    # and be tried out (the CI of 5220c1d failed the old "at most one rank at 0"; it printed no sizes):
    # whoever is out, the strategy said why
    said = " ".join(part.split(":")[0] for n in notes for part in n.split("; ")).replace(",", " ").split()
    assert all(str(r) in said for s in sizes for r in (1, 2) if s[r] == 0), (sizes, notes)
    assert any(n.startswith("rank 3 is back") for n in notes), notes
    models = [r["rebalance_model"] for r in records if r.get("rebalance_model")]  # why each split, per rank
    assert len(models) >= 8 and all(len(v) == 4 for m in models for v in m.values()), models[:1]
    first = models[0]["per_sample_ms"]  # an emulated sample at 2% of the speed: 250 ms against ~5
    assert first[3] > 5 * max(first[:3]), first
    # whether it then stays in at a fast rank's share depends on its re-measurement beside the
    # suite's other jobs (two fresh-clone CIs of 2026-11-29: a dip to 1, then [1, 1, 0, 0, 0, 0] on
    # Horovod, out again); a speed claim, measured by the sit-out benchmarks, not asserted here
    mine = json.load(open(multi / "ranks.json"))["ranks"][3]  # what rank 3 logged of its own updates
    assert mine["batch"] == [s[3] for s in sizes]
    # an update it sat out took it no compute (an emulated one of its samples takes 0.25 s)
    assert max(t for b, t in zip(mine["batch"], mine["compute"]) if b == 0) < 0.1
    # the state it got when it came back is logged apart, by it and by rank 0 that sent it
    back = [u for u in range(1, len(sizes)) if sizes[u - 1][3] == 0 and sizes[u][3] > 0]
    zero = json.load(open(multi / "ranks.json"))["ranks"][0]
    assert back and all(mine["catch_up"][u] > 0 and zero["catch_up"][u] > 0 for u in back), back
    # ... and so is making the set of the ranks that compute (torch: a new group at the first update out;
    # Horovod's sets of one rank out are made at start)
    made = {out[0]} if engine == "torch" else set()
    assert all(mine["catch_up"][u] > 0 for u in made)
    assert not any(mine["catch_up"][u] for u in range(len(sizes)) if u not in back and u not in made)

    diff = max_relative_difference(torch.load(tmp_path / "multi.pt", weights_only=True), single)
    print(f"{engine} engine, sat out and came back: max relative difference {diff:.3e}")
    assert diff <= 1e-10  # float64; measured 1.9e-13


def test_a_second_rank_goes_out_beside_one_out_and_training_stays_exact(tmp_path, single, fashion_dir):
    # rank 3 is out (EMULATED at 2%) and runs ahead of the others, who still reduce; rank 2 slows
    # to 2% at update 9, and the set of ranks 0 and 1 is made (Horovod initialised again) at the
    # first update that both sit out. Until 2026-11-27 rank 3 shut Horovod down under the
    # others' allreduce there: "Process set provided does not exist" on ranks 0-2, every run. Rank 3
    # is not measured again in this run (sit_out=20 of 10 rebalances): after 1, its return met rank
    # 2's slow-down in a CI run (both out together from all four), after 4 rank 2 went out only after
    # rank 3's return in another (update 23, loaded); here rank 3 is out from 5, rank 2 from 17
    slow = [{"update": 0, "speeds": [1, 1, 1, 0.02]}, {"update": 9, "speeds": [1, 1, 0.02, 0.02]}]
    args = emulated_run(tmp_path, fashion_dir, slow, sit_out=20)
    multi = tmp_path / "multi"
    assert_ok(horovodrun(4, args, timeout=400))
    sizes = [json.loads(line)["batch_sizes"] for line in open(multi / "updates.jsonl")]
    both = [u for u, s in enumerate(sizes) if s[2] == 0 and s[3] == 0]
    assert both and all(sizes[u - 1][3] == 0 and sizes[u - 1][2] > 0 for u in both[:1]), sizes  # 3 was out first
    # Horovod initialised again for the new set is logged apart from the step (its gap feeds the
    # fits): until 2026-11-27 it was rank 0's gap, 36 s at 8 ranks with four at 0.03 of a core,
    # and a fit of 44 ms per sample (0.4 before) brought the ranks out back
    zero = json.load(open(multi / "ranks.json"))["ranks"][0]
    made = both[0]
    assert zero["catch_up"][made] > 0 and zero["gap"][made] < zero["catch_up"][made], (zero["gap"], zero["catch_up"])
    diff = max_relative_difference(torch.load(tmp_path / "multi.pt", weights_only=True), single)
    print(f"a second rank out beside one out: max relative difference {diff:.3e}")
    assert diff <= 1e-10
