"""The straggler picture: who waited how long (pure arithmetic on hand-made steps), the PNG it
draws, and the pictures of a real ``bno-hvd experiment`` and of ``bno-hvd report`` on its logs."""

import json
import shutil

import numpy as np
import pytest
from support.checks import assert_png_drawing
from support.jobs import assert_ok, run_cli

from bno_hvd.lab.plots import plot_stragglers
from bno_hvd.library.timing import RankStep
from bno_hvd.training.stragglers import block_means, straggler_timeline, waited_seconds

# reads the experiment shared with test_experiment.py (conftest.py); its outcome depends on speed: runs alone
pytestmark = pytest.mark.alone

BLUE, ORANGE = (0.122, 0.467, 0.706), (1.0, 0.498, 0.055)  # compute, waited (matplotlib tab:blue, tab:orange)

# Three ranks, two updates (seconds). Update 0: rank 1 computes longest and arrives last, so its
# sync (0.02) is the allreduce alone; rank 0 arrived 0.10 s earlier and waited that long. Update 1
# has a rebalance: its gather adds 0.004/0.003/0.005, of which 0.001 and 0.002 are waiting.
STEPS = [
    [RankStep(8, 0.10, 0.12), RankStep(8, 0.30, 0.01, 0.004)],
    [RankStep(8, 0.20, 0.02), RankStep(8, 0.10, 0.21, 0.003)],
    [RankStep(8, 0.15, 0.07), RankStep(8, 0.10, 0.21, 0.005), RankStep(8, 9.0, 9.0)],  # logged one more
]


def test_who_waited_how_long_by_hand():
    t = straggler_timeline(STEPS)
    assert (t.ranks, t.updates) == (3, 2)  # the updates every rank logged
    assert t.waited == pytest.approx(np.array([[0.10, 0.001], [0.0, 0.20], [0.05, 0.202]]))
    assert t.exchange.tolist() == pytest.approx([0.02, 0.013])
    assert t.last.tolist() == [1, 0]
    assert t.last_share() == [0.5, 0.5, 0.0]
    assert t.mean_waited() == pytest.approx([0.0505, 0.10, 0.126])
    # the three parts add up to the whole update as each rank saw it
    whole = np.array([[s.seconds for s in steps[:2]] for steps in STEPS])
    assert t.compute + t.waited + t.exchange == pytest.approx(whole)
    assert waited_seconds([0.12, 0.02, 0.07]) == pytest.approx([0.10, 0.0, 0.05])
    assert waited_seconds([0.01, 0.21, 0.21], [0.004, 0.003, 0.005]) == pytest.approx(t.waited[:, 1].tolist())


def test_equal_ranks_wait_for_nobody_and_old_logs_have_no_sync():
    t = straggler_timeline([[RankStep(4, 0.1, 0.03)] * 5] * 4)
    assert not t.waited.any() and t.has_sync and t.last.tolist() == [0] * 5  # ties: the lowest rank
    old = straggler_timeline([[RankStep(4, 0.1)] * 3] * 2)  # ranks.json written before sync was measured
    assert not old.has_sync


def test_block_means_never_pad():
    assert block_means(np.array([[1.0, 2, 3, 4, 5]]), 2).tolist() == [[1.5, 3.5, 5.0]]
    assert block_means(np.array([1.0, 2]), 1).tolist() == [1.0, 2.0]


def test_picture_of_hand_made_steps(tmp_path):
    rng = np.random.default_rng(0)
    steps = [[RankStep(32, 0.16 + 0.01 * rng.random(), 0.05, 0.0) for _ in range(120)] for _ in range(3)]
    steps.append([RankStep(12, 0.20, 0.01) for _ in range(120)])  # the slow rank: others wait ~40 ms
    plot_stragglers(steps, str(tmp_path / "s.png"), title="hand-made")
    assert_png_drawing(tmp_path / "s.png", colours=(BLUE, ORANGE))
    plot_stragglers([[RankStep(4, 0.1)] * 1000] * 2, str(tmp_path / "long.png"), title="old log, long run")
    assert_png_drawing(tmp_path / "long.png", colours=(BLUE,))


# --- a real experiment and its report -------------------------------------------------------


@pytest.fixture(scope="module")
def experiment(tiny_experiment):
    return tiny_experiment[0]  # conftest.py: shared with test_experiment.py and test_fuzz_report.py


@pytest.mark.mpi
def test_experiment_draws_one_straggler_picture_per_run(experiment):
    for strategy in ("equal", "balanced"):
        assert_png_drawing(experiment / f"stragglers_cnn_{strategy}.png", colours=(BLUE, ORANGE))
        ranks = json.loads((experiment / "runs" / "cnn" / strategy / "ranks.json").read_text())["ranks"]
        assert [len(r["sync"]) for r in ranks] == [20, 20]  # one per update
        # one TensorBoard directory per run (model/strategy)
        events = list((experiment / "tb" / "cnn" / strategy).glob("events.out.tfevents.*"))
        assert len(events) == 1 and events[0].stat().st_size > 0


@pytest.mark.mpi
def test_report_redraws_the_straggler_pictures(experiment, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(experiment, copy)
    for png in copy.glob("stragglers_*.png"):
        png.unlink()
    assert_ok(run_cli("report", str(copy)))
    for strategy in ("equal", "balanced"):
        assert_png_drawing(copy / f"stragglers_cnn_{strategy}.png", colours=(BLUE, ORANGE))
