"""Checkpoints: atomic under a real SIGKILL mid-write, rotated, a damaged or code-running one
refused, the update log cut back to the checkpoint.

That a real 4-rank job killed for real (rank 0 sends itself SIGKILL after a checkpoint) and
resumed with ``--resume`` ends with the same parameters and per-update losses as the job run
straight through is tested once, on the hardest case: 4 uneven ranks whose split changes every 2
updates, reading through DataLoader workers, killed mid-epoch with allocations decided but not yet
used (``tests/library/test_loader_ranks.py``; text: ``tests/training/test_text_training.py``).
"""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from support.jobs import ROOT, mpi_env

from bno_hvd.common.errors import UsageError
from bno_hvd.lab.logread import read_updates
from bno_hvd.training.checkpoint import check_compatible, list_checkpoints, load_latest, save_checkpoint
from bno_hvd.training.results import UpdateRecord
from bno_hvd.training.runlog import UpdateLog

# A state whose pickling stops half-way: the writer is killed inside torch.save, with the
# temporary file open (torch writes the pickle, then the tensor bytes, into it).
SLOW_WRITER = r"""
import os, sys, time, torch
sys.path.insert(0, sys.argv[3])
from bno_hvd.training.checkpoint import save_checkpoint

class Stall:
    def __reduce__(self):
        open(sys.argv[2], "w").close()   # tell the test: bytes are being written now
        time.sleep(60)
        return (int, (0,))

save_checkpoint(sys.argv[1], 20, {"model": torch.zeros(1 << 20), "stall": Stall()}, keep=2)
"""


@pytest.mark.slow
def test_kill_during_a_write_leaves_the_previous_checkpoint_intact(tmp_path):
    directory = str(tmp_path / "ck")
    save_checkpoint(directory, 10, {"model": torch.arange(5.0)}, keep=2)
    marker = tmp_path / "writing"
    writer = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, directory, str(marker), ROOT], env=mpi_env())
    try:
        deadline = time.time() + 60
        while not marker.exists() and writer.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        assert marker.exists(), "the writer never started writing"
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    leftovers = sorted(os.listdir(directory))
    assert leftovers[0] == "ckpt-00000010.pt" and leftovers[1].startswith("ckpt-00000020.pt.tmp.")
    update, state = load_latest(directory)  # the half-written file is invisible
    assert update == 10 and torch.equal(state["model"], torch.arange(5.0))
    save_checkpoint(directory, 30, {"model": torch.ones(2)}, keep=2)  # the next save sweeps it away
    assert sorted(os.listdir(directory)) == ["ckpt-00000010.pt", "ckpt-00000030.pt"]


def test_rotation_keeps_the_newest(tmp_path):
    directory = str(tmp_path / "ck")
    for update in (5, 10, 15, 20, 25):
        save_checkpoint(directory, update, {"update": update}, keep=3)
    assert [u for u, _ in list_checkpoints(directory)] == [15, 20, 25]
    assert load_latest(directory)[1] == {"update": 25}
    assert load_latest(str(tmp_path / "none")) is None


def test_a_damaged_checkpoint_is_a_usage_error(tmp_path):
    (tmp_path / "ckpt-00000007.pt").write_bytes(b"\x00garbage")
    with pytest.raises(UsageError, match="ckpt-00000007.pt cannot be read.*remove it"):
        load_latest(str(tmp_path))


class _RunsCode:
    """Unpickling this calls ``Path.touch(marker)``: what a crafted checkpoint could do instead."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def test_a_checkpoint_that_would_run_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "code-ran"
    torch.save({"model": {}, "rng": _RunsCode(str(marker))}, tmp_path / "ckpt-00000009.pt")
    with pytest.raises(UsageError, match="ckpt-00000009.pt cannot be read"):
        load_latest(str(tmp_path))
    assert not marker.exists()
    # while numpy's RNG state, the one non-torch object a real checkpoint holds, still loads
    import numpy as np

    save_checkpoint(str(tmp_path), 10, {"rng": [{"numpy": np.random.get_state()}]})
    loaded = load_latest(str(tmp_path))[1]["rng"][0]["numpy"]
    assert loaded[0] == "MT19937" and np.array_equal(loaded[1], np.random.get_state()[1])


def test_resuming_under_other_flags_is_refused():
    saved = {"model": "cnn", "strategy": "fixed", "batch_sizes": (5, 11, 3, 13), "seed": 7, "lr": 0.1}
    check_compatible(saved, dict(saved, lr=0.01, updates=999), "ck")  # lr and updates may change
    with pytest.raises(UsageError, match="made with --batch-sizes 5,11,3,13 but this run has --batch-sizes 4,4,4,4"):
        check_compatible(saved, dict(saved, batch_sizes=[4, 4, 4, 4]), "ck")
    with pytest.raises(UsageError, match="--model cnn but this run has --model vgg16"):
        check_compatible(saved, dict(saved, model="vgg16"), "ck")


def test_update_log_drops_records_after_the_checkpoint_and_a_torn_line(tmp_path):
    log = UpdateLog(str(tmp_path), {"run": 1})
    for update in range(27):
        log.write(UpdateRecord(update, [1], 0.1, 1, 0.1 * update, loss=1.0))
    log.close()
    with open(tmp_path / "updates.jsonl", "a") as fh:
        fh.write('{"update": 27, "lo')  # the kill hit in the middle of a line
    log = UpdateLog(str(tmp_path), {"run": 2}, append=True, keep_before=20)
    log.write(UpdateRecord(20, [1], 0.1, 1, 2.0, loss=2.0))
    log.close()
    records = read_updates(str(tmp_path))
    assert [r.update for r in records] == list(range(21)) and records[-1].loss == 2.0
