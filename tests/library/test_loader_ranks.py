"""The DataLoader path under real mpirun/horovodrun: every sample once per epoch with workers and
changing allocations; 4 uneven ranks == 1 process on the global batch; a kill mid-epoch with
workers resumes exactly; image folders, user models and the Horovod example port train."""

import json
import os
import re

import numpy as np
import pytest
import torch
from PIL import Image
from support.checks import max_relative_difference
from support.jobs import ROOT, assert_ok, bno_cmd, horovodrun, mpirun, python_cmd
from support.resume import EXACT_40

from bno_hvd.allocation.sampler import epoch_permutation
from bno_hvd.lab.logread import read_updates
from bno_hvd.training.results import steps_from_json

pytestmark = pytest.mark.mpi

# -- every sample exactly once per epoch ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["persistent", "recreate", "batches"])
def test_every_sample_once_per_epoch_across_ranks(mode, tmp_path):
    proc = mpirun(
        4,
        python_cmd(os.path.join(ROOT, "tests", "support", "mpi_scripts", "loader_coverage.py"), str(tmp_path), mode),
        timeout=240,
    )
    assert_ok(proc)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
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


# -- exactness through the DataLoader -------------------------------------------------------------


def train_and_save(np_, strategy_flags, path, tmp_path, workers, extra=()):
    args = bno_cmd(
        "train",
        *strategy_flags,
        "--updates",
        "20",
        "--optimizer",
        "sgd",
        "--momentum",
        "0",
        "--dtype",
        "float64",
        "--lr",
        "0.01",
        "--seed",
        "7",
        "--no-eval",
        "--no-progress",
        "--latency-interval",
        "0",
        "--num-workers",
        str(workers),
        "--save-model",
        str(path),
        "--log-dir",
        str(tmp_path / f"log-{np_}"),
        *extra,
    )
    assert_ok(horovodrun(np_, args, timeout=400))
    return torch.load(path, map_location="cpu", weights_only=True)


def test_uneven_changing_ranks_through_workers_equal_one_process(tmp_path, fashion_available):
    # 4 ranks, a random split of 32 samples that changes every 3 updates, 2 loader workers each
    multi = train_and_save(
        4,
        ["--strategy", "random", "--base-batch-size", "8", "--rebalance-every", "3"],
        tmp_path / "multi.pt",
        tmp_path,
        workers=2,
    )
    single = train_and_save(1, ["--strategy", "fixed", "--batch-sizes", "32"], tmp_path / "single.pt", tmp_path, 0)
    sizes = [r.batch_sizes for r in read_updates(str(tmp_path / "log-4"))]
    assert len({tuple(s) for s in sizes}) >= 4 and all(sum(s) == 32 for s in sizes)
    diff = max_relative_difference(multi, single)
    print(f"DataLoader path, changing allocation: max relative difference {diff:.3e}")
    assert diff <= 1e-10  # float64; measured 2.7e-16


def test_killed_mid_epoch_with_workers_resumes_exactly(kill_and_resume):
    # 4096 synthetic samples, global batch 160: epoch 0 ends inside update 25; the kill at update
    # 25 (after the checkpoint of update 20) is mid-epoch, with allocations decided but not yet used
    run = [
        "train",
        "--dataset",
        "synthetic",
        "--strategy",
        "random",
        "--base-batch-size",
        "40",
        "--rebalance-every",
        "3",
        "--num-workers",
        "2",
        *EXACT_40,
    ]

    def between(r):
        state = torch.load(r.ckpt / "ckpt-00000020.pt", map_location="cpu", weights_only=False)
        pending = [u for u, _ in state["balancer"]["plan"]["changes"] if u > 20]
        assert state["balancer"]["plan"]["lag"] == 5 and pending, state["balancer"]["plan"]  # decided, not yet used

    r = kill_and_resume(run, timeout=300, after_kill=between)
    ref_model, ref_log, model, log_dir = r.ref_model, r.ref_log, r.model, r.log_dir
    ref, resumed = torch.load(ref_model, weights_only=True), torch.load(model, weights_only=True)
    assert all(torch.equal(resumed[k], ref[k]) for k in ref), max_relative_difference(resumed, ref)
    ref_records, records = read_updates(str(ref_log)), read_updates(str(log_dir))
    assert [r.batch_sizes for r in records] == [r.batch_sizes for r in ref_records]
    assert [r.loss for r in records] == pytest.approx([r.loss for r in ref_records], rel=1e-12)
    assert ref_records[-1].loss < ref_records[0].loss


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


def test_an_image_folder_trains_end_to_end_with_a_torchvision_model(tmp_path):
    data = write_image_folder(tmp_path / "images")
    log = tmp_path / "log"
    proc = horovodrun(
        2,
        bno_cmd(
            "train",
            "--dataset",
            "imagefolder",
            "--data-dir",
            str(data),
            "--image-size",
            "20",
            "--model",
            "resnet18",
            "--num-workers",
            "2",
            "--updates",
            "12",
            "--base-batch-size",
            "6",
            "--rebalance-every",
            "4",
            "--lr",
            "0.05",
            "--no-progress",
            "--log-dir",
            str(log),
            "--latency-interval",
            "0",
        ),
        timeout=400,
    )
    assert_ok(proc)
    m = re.search(r"test accuracy: ([0-9.]+) \((\d+)/(\d+)\)", proc.stdout)
    assert m and int(m.group(3)) == 12, proc.stdout[-2000:]
    run = json.loads((log / "run.json").read_text())
    assert run["config"]["model"] == "resnet18" and run["allocation_lag"] == 5
    steps = steps_from_json(json.loads((log / "ranks.json").read_text()))
    assert [len(s) for s in steps] == [12, 12] and all(x.batch >= 1 for s in steps for x in s)


def test_a_corrupt_image_names_the_file_and_ends_every_rank(tmp_path):
    data = write_image_folder(tmp_path / "images", train=16, corrupt="train/class1/img3.png")
    proc = horovodrun(
        2,
        bno_cmd(
            "train",
            "--dataset",
            "imagefolder",
            "--data-dir",
            str(data),
            "--image-size",
            "20",
            "--model",
            "cnn",
            "--num-workers",
            "1",
            "--updates",
            "30",
            "--base-batch-size",
            "8",
            "--no-progress",
            "--no-eval",
            "--latency-interval",
            "0",
        ),
        timeout=200,
    )
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    lines = [line for line in text.splitlines() if "bno-hvd: error:" in line]
    assert len(lines) == 1 and "class1/img3.png" in lines[0] and "cannot read" in lines[0], text[-3000:]
    assert "Traceback" not in text


def test_a_model_given_as_module_function_trains(tmp_path):
    proc = horovodrun(
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
