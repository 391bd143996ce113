"""The DataLoader path under real mpirun/horovodrun: every sample once per epoch with workers and
changing allocations; 4 uneven ranks == 1 process on the global batch; a kill mid-epoch with
workers resumes exactly (the suite's one kill-and-resume of an image run: checkpoints rotated,
the killed run's log cut back, ``--resume`` bit-identical); image folders, user models and the
Horovod example port train."""

import json
import os
import re

import numpy as np
import pytest
import torch
from PIL import Image
from support import resume
from support.checks import max_relative_difference
from support.jobs import ROOT, assert_ok, bno_cmd, horovodrun, mpirun, python_cmd

from bno_hvd.allocation.sampler import epoch_permutation
from bno_hvd.lab.logread import read_updates
from bno_hvd.training.checkpoint import list_checkpoints
from bno_hvd.training.results import steps_from_json

pytestmark = pytest.mark.mpi

# -- every sample exactly once per epoch ----------------------------------------------------------


MODES = ["persistent", "recreate", "batches"]


@pytest.fixture(scope="module")
def coverage(tmp_path_factory):
    """One 4-rank job runs the three modes one after another (a job's start-up costs more than a mode)."""
    out = tmp_path_factory.mktemp("coverage")
    script = os.path.join(ROOT, "tests", "support", "mpi_scripts", "loader_coverage.py")
    assert_ok(mpirun(4, python_cmd(script, str(out), *MODES), timeout=240))
    return out


@pytest.mark.parametrize("mode", MODES)
def test_every_sample_once_per_epoch_across_ranks(mode, coverage):
    ranks = [json.loads((coverage / f"{mode}-rank{r}.json").read_text()) for r in range(4)]
    assert [r["lag"] for r in ranks] == [5] * 4  # 2 workers x prefetch 2 + 1, agreed by all ranks
    n, updates = 103, 45
    stream, cum = [], 0
    for u in range(updates):
        parts = [r["seen"][u] for r in ranks]
        assert all(p["update"] == u for p in parts)
        sizes = parts[0]["sizes"]
        assert all(p["sizes"] == sizes for p in parts), f"ranks disagree on update {u}"
        assert [len(p["indices"]) for p in parts] == sizes
        assert all(p["weight"] == pytest.approx(sizes[r] / sum(sizes)) for r, p in enumerate(parts))
        if mode != "batches":  # a loader epoch holds the updates whose global batch starts in it
            assert all(p["epoch"] == cum // n for p in parts), (u, cum, parts[0]["epoch"])
        stream += [i for p in parts for i in p["indices"]]
        cum += sum(sizes)
    expected = np.concatenate([epoch_permutation(n, 11, e) for e in range(cum // n + 1)])[:cum]
    assert stream == expected.tolist()  # one permutation per epoch, consumed in global batches
    assert cum // n >= 5
    assert len({tuple(r["seen"][u]["sizes"]) for r in ranks for u in range(updates)}) > 5


# -- exactness and kill-and-resume through the DataLoader ---------------------------------------

# 4 ranks, a random split of a global batch of 12 that changes every 2 updates, 2 loader workers
# each, reading 90 images from disk (written by the test), the latency probe every 2 updates: epoch 0
# ends inside update 7; the kill at update 7 (after the checkpoint of update 6) is mid-epoch, with
# allocations decided but not yet used. Checkpoints every 3 updates, 2 kept: 3 and 6 at the kill,
# rotated to 9 and 12 by the resumed run.
FLAGS = ["train", "--dataset", "imagefolder", "--image-size", "20", "--model", "cnn", "--updates", "14"]
FLAGS += ["--dtype", "float64", "--lr", "0.05", "--seed", "3", "--no-eval", "--no-progress", "--latency-interval", "2"]
RANDOM = ["--strategy", "random", "--base-batch-size", "3", "--rebalance-every", "2", "--num-workers", "2"]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """The 4-rank run straight through, and killed at update 7 and resumed (:mod:`support.resume`),
    with the image folder it read and what was on disk between the kill and the resume."""
    root = tmp_path_factory.mktemp("resume")
    data = write_image_folder(root / "images", train=30, val=1)
    run = [*FLAGS, "--data-dir", str(data), *RANDOM]
    between = {}

    def after_kill(r):
        between["model"] = r.model.exists()
        between["checkpoints"] = [u for u, _ in list_checkpoints(str(r.ckpt))]
        between["updates"] = [x.update for x in read_updates(str(r.log_dir))]
        between["state"] = torch.load(r.ckpt / "ckpt-00000006.pt", map_location="cpu", weights_only=False)

    r = resume.kill_and_resume(root, run, kill_at=7, every=3, keep=2, timeout=300, after_kill=after_kill)
    return r, data, between


def test_uneven_changing_ranks_through_workers_equal_one_process(resumed, tmp_path):
    r, data, _ = resumed
    single = tmp_path / "single.pt"
    run = [*FLAGS, "--data-dir", str(data), "--strategy", "fixed", "--batch-sizes", "12"]
    assert_ok(mpirun(1, bno_cmd(*run, "--save-model", str(single), "--log-dir", str(tmp_path / "log")), timeout=300))
    sizes = [x.batch_sizes for x in read_updates(str(r.ref_log))]
    assert len({tuple(s) for s in sizes}) >= 4 and all(sum(s) == 12 for s in sizes)
    diff = max_relative_difference(torch.load(r.ref_model, weights_only=True), torch.load(single, weights_only=True))
    print(f"DataLoader path, changing allocation: max relative difference {diff:.3e}")
    assert diff <= 1e-10  # float64; measured 2.7e-16


def test_killed_mid_epoch_with_workers_resumes_exactly(resumed):
    r, _, between = resumed
    # between the kill and the resume: no model yet, the two newest checkpoints, the log up to the
    # kill (update 6 is in it and will be redone: the checkpoint holds 6 updates)
    assert not between["model"] and between["checkpoints"] == [3, 6]
    assert between["updates"] == list(range(7))
    state = between["state"]
    pending = [u for u, _ in state["balancer"]["plan"]["changes"] if u > 6]
    assert state["balancer"]["plan"]["lag"] == 5 and pending, state["balancer"]["plan"]  # decided, not yet used
    assert json.loads((r.log_dir / "run.json").read_text())["resumed_from"] == 6
    assert [u for u, _ in list_checkpoints(str(r.ckpt))] == [9, 12]  # rotated
    ref, model = torch.load(r.ref_model, weights_only=True), torch.load(r.model, weights_only=True)
    assert all(torch.equal(model[k], ref[k]) for k in ref), max_relative_difference(model, ref)
    ref_records, records = read_updates(str(r.ref_log)), read_updates(str(r.log_dir))
    assert [x.update for x in records] == list(range(14))  # every update once, despite the kill
    assert [x.batch_sizes for x in records] == [x.batch_sizes for x in ref_records]
    assert [x.loss for x in records] == pytest.approx([x.loss for x in ref_records], rel=1e-12)
    assert ref_records[-1].loss < ref_records[0].loss  # it trained (not two initialisations compared)


# -- users' data and models -----------------------------------------------------------------------


def write_image_folder(root, classes=3, train=12, val=4, side=20, corrupt=None):
    """Class c is a colour plus noise: learnable from a few samples."""
    rng = np.random.default_rng(0)
    colours = [(220, 40, 40), (40, 200, 60), (50, 60, 220)]
    for split, count in (("train", train), ("val", val)):
        for c in range(classes):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for k in range(count):
                pixels = np.clip(np.array(colours[c]) + rng.normal(0, 30, (side, side, 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"img{k}.png")
    if corrupt:
        (root / corrupt).write_bytes(b"\x89PNG\r\n\x1a\n not really an image")
    return root


def train_on_images(data, *flags, timeout=400):
    """``bno-hvd train`` on the image folder ``data`` (20-pixel images) on 2 ranks under horovodrun."""
    common = ["--dataset", "imagefolder", "--data-dir", str(data), "--image-size", "20"]
    common += ["--no-progress", "--latency-interval", "0"]
    return horovodrun(2, bno_cmd("train", *common, *flags), timeout=timeout)


def test_an_image_folder_trains_end_to_end_with_a_torchvision_model(tmp_path):
    data, log = write_image_folder(tmp_path / "images"), tmp_path / "log"
    flags = ["--model", "resnet18", "--num-workers", "2", "--updates", "6", "--base-batch-size", "6"]
    proc = train_on_images(data, *flags, "--rebalance-every", "3", "--lr", "0.05", "--log-dir", str(log))
    assert_ok(proc)
    m = re.search(r"test accuracy: ([0-9.]+) \((\d+)/(\d+)\)", proc.stdout)
    assert m and int(m.group(3)) == 12, proc.stdout[-2000:]
    run = json.loads((log / "run.json").read_text())
    assert run["config"]["model"] == "resnet18" and run["allocation_lag"] == 5
    steps = steps_from_json(json.loads((log / "ranks.json").read_text()))
    assert [len(s) for s in steps] == [6, 6] and all(x.batch >= 1 for s in steps for x in s)


def test_a_corrupt_image_names_the_file_and_ends_every_rank(tmp_path):
    data = write_image_folder(tmp_path / "images", train=16, corrupt="train/class1/img3.png")
    flags = ["--model", "cnn", "--num-workers", "1", "--updates", "30", "--base-batch-size", "8", "--no-eval"]
    proc = train_on_images(data, *flags, timeout=200)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    lines = [line for line in text.splitlines() if "bno-hvd: error:" in line]
    assert len(lines) == 1 and "class1/img3.png" in lines[0] and "cannot read" in lines[0], text[-3000:]
    assert "Traceback" not in text


def test_a_model_given_as_module_function_trains(tmp_path):
    """(Plain mpirun: the launcher is not the point; the tests above use horovodrun.)"""
    proc = mpirun(
        2,
        bno_cmd(
            "train",
            "--dataset",
            "synthetic",
            "--model",
            "tests.support.user_model:small_mlp",
            "--updates",
            "30",
            "--base-batch-size",
            "16",
            "--lr",
            "0.1",
            "--no-progress",
            "--latency-interval",
            "0",
            "--save-model",
            str(tmp_path / "m.pt"),
        ),
        timeout=300,
    )
    assert_ok(proc)
    acc = float(re.search(r"test accuracy: ([0-9.]+)", proc.stdout).group(1))
    assert acc > 0.3, proc.stdout[-1000:]
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    assert set(state) == {"net.1.weight", "net.1.bias", "net.3.weight", "net.3.bias"}  # the user's module
