"""The user-input surfaces of bno-hvd, one :class:`Surface` each in :data:`SURFACES`.

A surface is what to build (a Hypothesis strategy), how to call its parser on it (``run``, given a
fresh directory for files), and what a valid result must satisfy (``check``). A new surface is
one more entry; one that does not exist yet is a placeholder with ``todo`` (skipped, with the
reason). ``tests/cli/test_fuzz_inputs.py`` runs them all against :mod:`fuzz_property`. The command-line
surfaces' builders and checks are in :mod:`fuzz_surfaces_cli`, the run-time ones (quotas, caps,
TensorBoard, launchers) in :mod:`fuzz_surfaces_run`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from support import fuzz_strategies as fs
from support import fuzz_surfaces_cli as fcli
from support import fuzz_surfaces_run as frun
from support import fuzz_trees as ft
from support.fuzz_property import TIME_LIMIT, assert_one_line, in_range, write_file
from support.jobs import CLI_TIMEOUT

from bno_hvd.allocation import STRATEGY_NAMES, load_metrics_file, make_strategy
from bno_hvd.cli.hostfile import parse_hostfile, write_clean_hostfile
from bno_hvd.common import parsing
from bno_hvd.data.catalog import MODEL_NAMES
from bno_hvd.lab.emulation import load_schedule, parse_speeds

CI_EXAMPLES = 150  # per surface of weight 1, without BNO_FUZZ_EXAMPLES


@dataclass(frozen=True)
class Surface:
    """One user-input surface: what to build, how to call the parser, what a valid result is."""

    name: str
    inputs: st.SearchStrategy | None
    run: Callable[[Any, Path], Any] | None  # (input, fresh directory) -> the parser's result
    check: Callable[[Any, Any], None] = lambda inp, result: None  # asserts a result is valid
    weight: float = 1.0  # share of the example budget (slow surfaces get less)
    todo: str | None = None  # placeholder: why it is skipped
    time_limit: float = TIME_LIMIT  # seconds an example may take (more where it starts a process)

    def examples(self) -> int:
        total = os.environ.get("BNO_FUZZ_EXAMPLES")
        if total:
            return max(1, round(int(total) * self.weight / sum(s.weight for s in SURFACES if not s.todo)))
        return max(10, round(CI_EXAMPLES * self.weight))


# metrics files: load, then every strategy must allocate from it (what `bno-hvd allocate` does)


def run_metrics(inp, directory):
    metrics = load_metrics_file(write_file(directory, inp))
    out = {}
    for name in STRATEGY_NAMES:
        strategy = make_strategy(name, metrics.n, 32, batch_sizes=[8] * metrics.n if name == "fixed" else None)
        sizes = strategy.rebalance(metrics, strategy.initial(), 10)
        out[name] = (strategy, strategy.rebalance(metrics, sizes, 20))
    return metrics, out


def check_metrics(inp, result):
    metrics, allocations = result
    assert 1 <= metrics.n <= parsing.MAX_LIST
    for name, (strategy, sizes) in allocations.items():
        assert len(sizes) == metrics.n and all(isinstance(b, int) and 1 <= b for b in sizes), (name, sizes)
        if not strategy.changes_global_batch:
            assert sum(sizes) == strategy.global_batch, (name, sizes)


# schedules, hostfiles, list flags


def run_schedule(inp, directory):
    return load_schedule(str(write_file(directory, inp)), inp["n_ranks"])


def check_schedule(inp, schedule):
    updates = [u for u, _ in schedule.entries]
    assert updates[0] == 0 and updates == sorted(set(updates))
    assert all(len(v) == inp["n_ranks"] and in_range(v, parsing.SPEED) for _, v in schedule.entries)


def run_hostfile(inp, directory):
    hosts = parse_hostfile(write_file(directory, inp))
    clean = directory / "clean"
    write_clean_hostfile(hosts, clean)
    return hosts, parse_hostfile(clean), clean.read_text()


def check_hostfile(inp, result):
    from horovod.runner.common.util.hosts import parse_hosts

    hosts, again, clean = result
    assert hosts and again == hosts, "the clean copy must read back as the same hosts"
    assert len({h.hostname for h in hosts}) == len(hosts)
    assert all(parsing.SLOTS.contains(h.slots) and h.hostname.isprintable() for h in hosts)
    lines = clean.splitlines()  # what horovodrun's parser makes of the clean copy (launch/run)
    parsed = parse_hosts(",".join(f"{line.split()[0]}:{line.split('=')[1]}" for line in lines))
    assert [(h.hostname, h.slots) for h in parsed] == [(h.hostname, h.slots) for h in hosts]


def check_int_list(inp, values):
    assert values is None or (0 < len(values) <= parsing.MAX_LIST and in_range(values, parsing.BATCH))


def check_speeds(inp, values):
    assert 0 < len(values) <= parsing.MAX_LIST and in_range(values, parsing.SPEED)


def check_names(allowed):
    def check(inp, names):
        assert names and set(names) <= set(allowed)

    return check


# checkpoints


def build_checkpoint_dir(inp, directory: Path) -> Path:
    ck = directory / inp["dir"]
    ck.mkdir()
    for name, content in inp["files"]:
        path = ck / name
        if content == "dir":
            path.mkdir()
        elif content == "link":
            path.symlink_to(ck / "nowhere")
        else:
            path.write_bytes(content)
    return ck


def run_checkpoint_dir(inp, directory):
    """What ``train --resume`` does on rank 0 with the directory (model, optimizer, balancer, RNGs)."""
    import random

    import numpy as np
    import torch

    from bno_hvd.allocation import make_strategy
    from bno_hvd.data.models import BaselineCNN
    from bno_hvd.library.balancer import Balancer
    from bno_hvd.training.checkpoint import read_checkpoint, restore_training_state
    from bno_hvd.training.config import TrainConfig

    ck = str(build_checkpoint_dir(inp, directory))
    cfg = TrainConfig(dataset="synthetic", checkpoint_dir=ck, resume=True)
    found = read_checkpoint(ck, cfg.to_dict())
    model = BaselineCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    balancer = Balancer(ft.OneRank(), make_strategy(cfg.strategy, 1, cfg.base_batch_size), 4096)
    saved = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        return found, restore_training_state(cfg, ft.OneRank(), model, optimizer, balancer)
    finally:  # the file's RNG states must not leak into the test process
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])


def check_checkpoint_dir(inp, result):
    found, resumed = result
    assert resumed == (None if found is None else found[0])
    if found is None:  # nothing to resume: then no file has a checkpoint's name
        assert not any(re.fullmatch(r"ckpt-\d{8}\.pt", name) for name, _ in inp["files"]), inp["files"]
    else:
        update, state = found
        assert isinstance(update, int) and isinstance(state, dict)
        assert {"model", "optimizer", "balancer"} <= set(state) and isinstance(state.get("config", {}), dict)


def run_checkpoint_config(saved, directory):
    from bno_hvd.training.checkpoint import check_compatible
    from bno_hvd.training.config import TrainConfig

    check_compatible(saved, TrainConfig().to_dict(), str(directory / "ckpt-00000010.pt"))
    return True  # compatible


# models, image folders


def run_model(inp, directory):
    from bno_hvd.data.models import build_model

    channels, side = (inp["shape"][0], inp["shape"][1]) if len(inp["shape"]) == 2 else (1, 28)
    return build_model(inp["spec"], inp["num_classes"], (channels, side, side))


def check_model(inp, model):
    import torch

    assert isinstance(model, torch.nn.Module)


def build_image_tree(tree, directory: Path) -> Path:
    root = directory / "data"
    root.mkdir()
    for rel, kind, payload in tree:
        path = root / rel
        if os.path.lexists(path) or not path.parent.is_dir() and os.path.lexists(path.parent):
            continue  # two generated names met (a file where a folder was to go): keep the first
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "dir":
            path.mkdir(exist_ok=True)
        elif kind == "file":
            path.write_bytes(payload)
        elif kind == "link":
            path.symlink_to(payload)
    return root


def run_image_folder(inp, directory):
    from bno_hvd.data.images import load_datasets
    from bno_hvd.library.loader import CollateToBatch, KeyedDataset

    data = load_datasets("imagefolder", str(build_image_tree(inp["tree"], directory)), image_size=inp["image_size"])
    batches = []
    for split in (data.train, data.test):  # read every sample as the loader does on a rank
        keyed = KeyedDataset(split, seed=0, seed_samples=True, fast_tensors=False)
        keys = [(0, 0, i) for i in range(min(len(split), 16))]
        batches.append(CollateToBatch()(keyed.__getitems__(keys)))
    return data, batches


def check_image_folder(inp, result):
    data, batches = result
    assert len(data.train) >= 1 and data.num_classes == len(data.train.classes) >= 1
    assert data.input_shape == (3, inp["image_size"], inp["image_size"])
    for batch in batches:
        for line in ([batch.error] if batch.error is not None else []) + list(batch.notes):
            assert_one_line(line)


SURFACES = [
    Surface("metrics-file-dense", fs.metrics_files(sparse=False), run_metrics, check_metrics),
    Surface("metrics-file-pairs", fs.metrics_files(sparse=True), run_metrics, check_metrics),
    Surface("allocate-cli", fcli.allocate_inputs, fcli.run_allocate, weight=0.5),
    Surface("emulate-schedule", fs.schedule_files(), run_schedule, check_schedule),
    Surface("hostfile", fs.hostfiles, run_hostfile, check_hostfile),
    Surface(
        "batch-sizes", fs.list_flag_text(), lambda t, d: parsing.parse_int_list(t, "--batch-sizes"), check_int_list
    ),
    Surface("emulate-speed", fs.list_flag_text(), lambda t, d: parse_speeds(t), check_speeds),
    Surface(
        "strategies",
        fs.strategy_lists,
        lambda t, d: parsing.parse_name_list(t, "--strategies", STRATEGY_NAMES),
        check_names(STRATEGY_NAMES),
    ),
    Surface(
        "models",
        fs.model_lists,
        lambda t, d: parsing.parse_name_list(t, "--models", MODEL_NAMES),
        check_names(MODEL_NAMES),
    ),
    Surface("checkpoint-dir", ft.checkpoint_dirs, run_checkpoint_dir, check_checkpoint_dir, weight=0.5),
    Surface("checkpoint-config", ft.config_dicts(), run_checkpoint_config),
    Surface("model-spec", ft.model_inputs, run_model, check_model, weight=0.2),
    Surface("image-folder", ft.image_folders, run_image_folder, check_image_folder, weight=0.3),
    Surface("train-dry-run", fcli.train_inputs, fcli.run_train_dry, weight=0.3),
    Surface("probe-flags", fcli.probe_inputs, fcli.run_probe_flags),
    Surface("experiment-flags", fcli.experiment_inputs, fcli.run_experiment_flags, fcli.check_experiment_dir),
    Surface("cpu-quota", frun.quota_inputs, frun.run_quotas, frun.check_quotas),
    Surface("cpu-quota-schedule", fcli.QUOTA_SCHEDULES, frun.run_quota_schedule, frun.check_quota_schedule),
    Surface("max-batch", frun.cap_inputs, frun.run_caps, frun.check_caps),
    Surface("tensorboard-dir", frun.tensorboard_inputs, frun.run_tensorboard, frun.check_tensorboard_dir, weight=0.3),
    Surface("launcher-env", frun.launcher_envs, frun.run_launcher_env, frun.check_launcher_env),
    # starts a process (bash, then `bno-hvd train --dry-run`): bounded as the suite's other CLI runs are; the
    # alarm cannot discount a child's wait for a CPU (CI, 2026-11-28: the first example over 20 s beside 2 workers)
    Surface(
        "slurm-job",
        frun.slurm_inputs,
        frun.run_slurm_job,
        frun.check_slurm_job,
        weight=0.1,
        time_limit=CLI_TIMEOUT + 10,
    ),
]
