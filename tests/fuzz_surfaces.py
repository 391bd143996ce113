"""The user-input surfaces of bno-hvd, one :class:`Surface` each in :data:`SURFACES`.

A surface is what to build (a Hypothesis strategy), how to call its parser on it (``run``, given a
fresh directory for files), and what a valid result must satisfy (``check``). A new surface is
one more entry; one that does not exist yet is a placeholder with ``todo`` (skipped, with the
reason). ``tests/test_fuzz_inputs.py`` runs them all against :mod:`fuzz_property`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fuzz_strategies as fs
import fuzz_trees as ft
from fuzz_property import assert_one_line, cli_result
from hypothesis import strategies as st

from bno_hvd import parsing
from bno_hvd.allocation import STRATEGY_NAMES, load_metrics_file, make_strategy
from bno_hvd.catalog import MODEL_NAMES
from bno_hvd.emulation import load_schedule, parse_speeds
from bno_hvd.errors import UsageError
from bno_hvd.hostfile import parse_hostfile, write_clean_hostfile

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

    def examples(self) -> int:
        total = os.environ.get("BNO_FUZZ_EXAMPLES")
        if total:
            return max(1, round(int(total) * self.weight / sum(s.weight for s in SURFACES if not s.todo)))
        return max(10, round(CI_EXAMPLES * self.weight))


def write_file(directory: Path, spec: dict) -> Path:
    path = directory / spec["name"]
    path.write_bytes(spec["content"])
    return path


def in_range(values, bounds: parsing.Range) -> bool:
    return all(bounds.contains(float(v)) for v in values)


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
    from bno_hvd.balancer import Balancer
    from bno_hvd.checkpoint import read_checkpoint, restore_training_state
    from bno_hvd.config import TrainConfig
    from bno_hvd.models import BaselineCNN

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
    from bno_hvd.checkpoint import check_compatible
    from bno_hvd.config import TrainConfig

    check_compatible(saved, TrainConfig().to_dict(), str(directory / "ckpt-00000010.pt"))
    return True  # compatible


# models, image folders


def run_model(inp, directory):
    from bno_hvd.models import build_model

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
    from bno_hvd.data import load_datasets
    from bno_hvd.loader import CollateToBatch, KeyedDataset

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


# CLI: train --dry-run (TrainConfig and everything prepare() checks), allocate


def train_args(inp, directory: Path) -> list[str]:
    """``bno-hvd train`` arguments for generated flags; their files are written under ``directory``."""
    args = ["train", "--no-progress", "--dataset", "synthetic"]
    for flag, value in inp["flags"]:
        if flag in ("--emulate-schedule", "--cpu-quota-schedule"):
            value = str(write_file(directory, value))
        elif flag in ("--log-dir", "--checkpoint-dir", "--save-model", "--tensorboard"):
            (directory / "a-file").write_text("x")
            value = str(directory / value)
        args += [flag] if value is None else [flag, value]
    return [a.replace("\x00", "") for a in args]  # a real argv cannot hold NUL


def run_train_dry(inp, directory):
    args = train_args(inp, directory) + ["--dry-run"]
    return cli_result(args, ok_output=lambda out: _assert_equal(out, "ok\n"))


def run_allocate(inp, directory):
    args = ["allocate", "--metrics", str(write_file(directory, inp["metrics"]))]
    for flag, value in inp["flags"]:
        args += [flag, value.replace("\x00", "")]  # a real argv cannot hold NUL
    return cli_result(args, ok_output=_check_allocation_json)


def _check_allocation_json(stdout):
    out = json.loads(stdout)
    assert out["batch_sizes"] and all(isinstance(b, int) and b >= 1 for b in out["batch_sizes"])


def _assert_equal(got, expected):
    assert got == expected, got


EDGE_INTS = [0, -1, 1, 64, 65, 256, 257, 4096, 4097, 65536, 65537, 10**6, 10**6 + 1, 10**9, 10**9 + 1]
EDGE_INTS += [2**31, 2**32 - 1, 2**32, 2**63, 2**64, 10**20]
int_text = st.one_of(
    st.integers(-3, 70).map(str),
    st.sampled_from(EDGE_INTS).map(str),
    st.integers().map(str),
    st.sampled_from(["1" * 400, "1" * 5000, "1_000", "٣", "", " 5"]),
    fs.texts(max_size=4),
)
float_text = st.one_of(
    st.floats(0, 1e3).map(repr),
    st.floats().map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e308", "1e-300", "5e-324", "0", "-0.0", "1e-9", "0.001", "0.009"]),
    st.sampled_from(["0.01", "0.1", "0.09", "86400", "86401", "1e7", "1e8", "10000000.1"]),
    fs.texts(max_size=4),
)
QUOTA_SCHEDULES = fs.schedule_files("quotas", parsing.QUOTA.low, parsing.QUOTA.high)
path_text = st.one_of(st.sampled_from(["out", "a-file", "a-file/sub", "new/deeper"]), fs.odd_names)
TRAIN_FLAGS = {
    **dict.fromkeys(
        ["--updates", "--base-batch-size", "--global-batch", "--rebalance-every", "--num-workers"]
        + ["--prefetch-factor", "--allocation-lag", "--threads", "--seed", "--checkpoint-every"]
        + ["--keep-checkpoints", "--eval-every", "--world-size", "--image-size"],
        int_text,
    ),
    "--num-classes": st.one_of(st.integers(1, 1000).map(str), int_text),
    **dict.fromkeys(["--lr", "--momentum", "--emulate-rate", "--latency-interval"], float_text),
    "--batch-sizes": fs.list_flag_text(),
    "--emulate-speed": fs.list_flag_text(),
    "--strategy": fs.mostly(st.sampled_from(STRATEGY_NAMES), fs.texts(max_size=6)),
    "--optimizer": st.sampled_from(["sgd", "adam", "SGD", ""]),
    "--dtype": st.sampled_from(["float32", "float64", "float16"]),
    "--lr-scaling": st.sampled_from(["linear", "none", "sqrt"]),
    "--model": st.one_of(
        st.sampled_from(["cnn", "cnn", "lenet", "a:b", f"{ft.FIXTURE_MODULE}:ok"]), fs.texts(max_size=6)
    ),
    "--dataset": st.sampled_from(["synthetic", "synthetic", "synthetic", "mnist", "imagefolder", "cifar"]),
    "--emulate-schedule": fs.schedule_files(),
    "--cpu-quota": fs.list_flag_text(),
    "--cpu-quota-schedule": QUOTA_SCHEDULES,
    "--cpu-quota-period": float_text,
    "--max-batch": st.one_of(fs.list_flag_text(), st.sampled_from(["auto", "Auto", "16", "64,64,64,16"])),
    "--device": st.sampled_from(["auto", "cpu", "cuda", "gpu"]),
    "--collectives": st.sampled_from(["mpi", "gloo", "nccl"]),
    "--tensorboard": path_text,
    "--inject-fault": st.one_of(st.sampled_from(["kill:1:5", "nan-loss:0:3,kill:2:9"]), fs.texts(max_size=12)),
    **dict.fromkeys(["--log-dir", "--checkpoint-dir", "--save-model"], path_text),
    **dict.fromkeys(["--resume", "--no-eval", "--pin-memory", "--amp", "--no-amp"], st.none()),
}
train_flags = st.lists(
    st.sampled_from(sorted(TRAIN_FLAGS)).flatmap(lambda f: TRAIN_FLAGS[f].map(lambda v: (f, v))), max_size=8
)
train_inputs = st.fixed_dictionaries({"flags": train_flags})
# under mpirun (the job's size is -np): the flags whose files and paths are checked after MPI
# starts (a bad --log-dir on rank 0 alone must still end all 4 ranks), and the per-rank lists
_MPI_FLAGS = ["--emulate-schedule", "--log-dir", "--checkpoint-dir", "--save-model", "--emulate-speed"]
_MPI_FLAGS += ["--batch-sizes", "--model", "--max-batch", "--global-batch"]
mpirun_train_inputs = st.fixed_dictionaries(
    {
        "flags": st.lists(
            st.sampled_from(_MPI_FLAGS).flatmap(lambda f: TRAIN_FLAGS[f].map(lambda v: (f, v))), min_size=1, max_size=4
        )
    }
)
ALLOCATE_FLAGS = {
    "--strategy": st.sampled_from(STRATEGY_NAMES),
    "--base-batch-size": int_text,
    "--global-batch": int_text,
    "--seed": int_text,
    "--batch-sizes": fs.list_flag_text(),
}
allocate_inputs = st.fixed_dictionaries(
    {
        "metrics": fs.metrics_files(sparse=False),
        "flags": st.lists(
            st.sampled_from(sorted(ALLOCATE_FLAGS)).flatmap(lambda f: ALLOCATE_FLAGS[f].map(lambda v: (f, v))),
            max_size=3,
        ),
    }
)


def run_probe_flags(inp, directory):
    from bno_hvd.commands.allocate import check_probe_flags

    check_probe_flags(**inp)
    return True


probe_ints = st.one_of(st.integers(-2, 70), st.sampled_from(EDGE_INTS), st.integers())
probe_inputs = st.fixed_dictionaries(
    {k: probe_ints for k in ("steps", "batch_size", "probe_bytes", "repeats", "threads")}
    | {"max_rounds": st.one_of(st.none(), probe_ints)}
)


def run_experiment_flags(inp, directory):
    """``bno-hvd experiment``'s own checks (TrainConfig's are train-dry-run's); --out is created."""
    from bno_hvd.commands.experiment import check_experiment

    out = directory / inp["out"]
    if inp["out_is_file"]:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("x")
    check_experiment(inp["updates"], inp["average_every"], inp["eval"], inp["target"], str(out))
    return out


def check_experiment_dir(inp, out):
    assert out.is_dir()


experiment_inputs = st.fixed_dictionaries(
    {
        "updates": st.integers(1, 10**9),
        "average_every": st.one_of(st.integers(-2, 200), st.integers()),
        "eval": st.booleans(),
        "target": st.one_of(st.none(), st.floats()),
        "out": st.one_of(fs.odd_names, st.sampled_from(["out", "a/b/c"])),
        "out_is_file": st.booleans(),
    }
)

# real slowness (CPU quotas), per-rank memory caps, TensorBoard


def run_quotas(inp, directory):
    """``--cpu-quota`` and ``--cpu-quota-period`` as ``train`` reads them: the shares, then their period."""
    from bno_hvd.config import TrainConfig
    from bno_hvd.cpuquota import parse_quotas, period_for

    quotas = parse_quotas(inp["quotas"])
    cfg = TrainConfig(cpu_quota=tuple(quotas), cpu_quota_period_ms=inp["period_ms"])
    return quotas, period_for(parsing.RankSchedule.constant(quotas), cfg.cpu_quota_period_ms)


def check_quota_period(values, period) -> None:
    from bno_hvd.cpuquota import MAX_PERIOD_US, MIN_QUOTA_US

    assert isinstance(period, int) and 1000 <= period <= MAX_PERIOD_US, period
    assert min(values) * period >= MIN_QUOTA_US * (1 - 1e-9), (min(values), period)  # the kernel takes it


def check_quotas(inp, result):
    quotas, period = result
    assert 0 < len(quotas) <= parsing.MAX_LIST and in_range(quotas, parsing.QUOTA)
    check_quota_period(quotas, period)


valid_quota_text = st.lists(st.floats(0.01, 64).map(repr), min_size=1, max_size=6).map(",".join)
quota_inputs = st.fixed_dictionaries(
    {
        "quotas": st.one_of(valid_quota_text, fs.list_flag_text()),
        "period_ms": st.one_of(st.none(), st.floats(), st.floats(0.5, 1001)),
    }
)


def run_quota_schedule(inp, directory):
    from bno_hvd.cpuquota import load_quota_schedule, period_for

    schedule = load_quota_schedule(str(write_file(directory, inp)), inp["n_ranks"])
    return schedule, period_for(schedule)


def check_quota_schedule(inp, result):
    schedule, period = result
    updates = [u for u, _ in schedule.entries]
    assert updates[0] == 0 and updates == sorted(set(updates))
    assert all(len(v) == inp["n_ranks"] and in_range(v, parsing.QUOTA) for _, v in schedule.entries)
    check_quota_period([v for _, values in schedule.entries for v in values], period)


def run_caps(inp, directory):
    """``--max-batch``: one cap for all ranks or one per rank, checked against the job's size."""
    from bno_hvd.commands.flags import config_from_flags

    cfg = config_from_flags(max_batch=inp["text"])
    cfg.check_world(inp["ranks"])
    return cfg, [cfg.cap_of(r) for r in range(inp["ranks"])]


def check_caps(inp, result):
    cfg, caps = result
    if cfg.max_batch_auto:
        assert inp["text"] == "auto"
        return
    assert all(c is None or (isinstance(c, int) and parsing.CAP.contains(c)) for c in caps), caps
    if cfg.max_batch is not None and len(cfg.max_batch) > 1:  # per rank: exactly one per rank
        assert len(cfg.max_batch) == inp["ranks"] and caps == list(cfg.max_batch)


cap_inputs = st.fixed_dictionaries(
    {
        "text": st.one_of(
            fs.list_flag_text(),
            st.lists(st.integers(1, 10**6).map(str), min_size=1, max_size=6).map(",".join),
            st.sampled_from(["auto", "AUTO", "64,64,64,16", "16", "0,1"]),
        ),
        "ranks": st.integers(1, 6),
    }
)


def run_tensorboard(inp, directory):
    """``--tensorboard DIR`` on rank 0: checked before training, then events written there."""
    from types import SimpleNamespace

    from bno_hvd.config import TrainConfig
    from bno_hvd.runlog import check_output_paths
    from bno_hvd.tensorboard import TensorBoardHook

    if inp["existing"] == "file":
        (directory / "a-file").write_text("x")
    elif inp["existing"] == "dir":
        (directory / "out").mkdir()
    path = str(directory / inp["path"].replace("\x00", ""))
    check_output_paths(tensorboard=path)
    hook = TensorBoardHook(path, 0)
    run = SimpleNamespace(
        cfg=TrainConfig(tensorboard=path),
        world=SimpleNamespace(size=2),
        resumed_from=None,
        heterogeneity=None,
        balancer=SimpleNamespace(plan=SimpleNamespace(lag=1)),
    )
    hook.start(run)
    hook.close()
    return path


def check_tensorboard_dir(inp, path):
    files = [f for _, _, names in os.walk(path) for f in names]
    assert any(f.startswith("events.out.tfevents") for f in files), files


tensorboard_inputs = st.fixed_dictionaries({"path": path_text, "existing": st.sampled_from(["none", "file", "dir"])})


# launchers' environments: the rank and local size (Python), and Slurm's job variables (launch/slurm-job)

LAUNCHER_VARS = ["OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"]
LAUNCHER_VARS += ["OMPI_COMM_WORLD_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"]
env_value = st.one_of(int_text, st.sampled_from(["²", "٣", "2(x3)", "4,2", "00", "0x10"]))
launcher_envs = st.dictionaries(st.sampled_from(LAUNCHER_VARS), env_value, max_size=4)


def run_launcher_env(env, directory):
    from bno_hvd.launching import YIELD, arrange_for_shared_cores, ranks_on_this_host
    from bno_hvd.world import launched_rank

    environ = dict(env)
    note = arrange_for_shared_cores(environ)
    return launched_rank(env), ranks_on_this_host(env), note, environ.get(YIELD)


def check_launcher_env(env, result):
    rank, local, note, yield_setting = result
    assert isinstance(rank, int) and 0 <= rank
    assert local is None or isinstance(local, int) and local >= 0
    assert (note is None) == (yield_setting is None)
    if note is not None:
        assert_one_line(note)


SLURM_JOB = Path(__file__).resolve().parent.parent / "launch" / "slurm-job"
NOT_A_LAUNCHER = "fuzz-stops-here"  # the script refuses it only after every other check passed


def run_slurm_job(inp, directory):
    """``launch/slurm-job`` (the body of launch/slurm.sbatch) with generated job variables, up to the
    launch: a launcher name it refuses stops it just before ``srun``, after every check of the job."""
    import subprocess

    env = {k: os.environ[k] for k in ("PATH", "HOME", "TMPDIR", "LANG") if k in os.environ}
    env.update({k: v.replace("\x00", "") for k, v in inp["env"].items()})
    env["BNO_SLURM_LAUNCHER"] = NOT_A_LAUNCHER
    env["OMP_NUM_THREADS"] = "1"
    args = [a.replace("\x00", "") for a in inp["args"]]
    try:
        done = subprocess.run(
            ["bash", str(SLURM_JOB), str(SLURM_JOB.parent.parent), *args],
            env=env,
            cwd=directory,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("launch/slurm-job did not finish within 60 s (a hang)") from None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    if lines and lines[-1].startswith("bno-hvd: error: BNO_SLURM_LAUNCHER must be"):
        assert len(lines) == 2 and lines[0].startswith("[slurm] job "), done.stderr[-2000:]
        return int(lines[0].split(": ")[1].split()[0])  # the world size it would start
    assert len(lines) == 1 and lines[0].startswith("bno-hvd: error: "), done.stderr[-3000:]
    raise UsageError(lines[0].removeprefix("bno-hvd: error: "))


def check_slurm_job(inp, ranks):
    env = inp["env"]
    if "SLURM_HET_SIZE" in env:
        groups = range(int(env["SLURM_HET_SIZE"]))
        expected = sum(int(env[f"SLURM_NTASKS_HET_GROUP_{g}"]) for g in groups)
    else:
        expected = int(env["SLURM_NTASKS"])
    assert ranks == expected and 1 <= ranks <= parsing.MAX_LIST, (ranks, env)


small_count = st.one_of(st.integers(1, 4).map(str), int_text)


@st.composite
def slurm_envs(draw):
    env = {}
    if draw(st.integers(0, 9)):
        env["SLURM_JOB_ID"] = draw(st.one_of(st.integers(1, 10**6).map(str), fs.texts(max_size=4)))
    env["SLURM_NTASKS"] = draw(small_count)
    if draw(st.booleans()):
        size = draw(st.one_of(st.integers(1, 3).map(str), int_text))
        env["SLURM_HET_SIZE"] = size
        shown = int(size) if size.isascii() and size.isdigit() and len(size) < 3 else 3
        for g in range(min(shown, 3)):
            if draw(st.integers(0, 9)):
                env[f"SLURM_NTASKS_HET_GROUP_{g}"] = draw(small_count)
    if draw(st.booleans()):
        env["BNO_TRAIN_ARGS"] = draw(
            st.sampled_from(["", "--updates 3", "--updates", "*", "--strategy bno", "--updates=-1", "a;b", "$(x)"])
        )
    return env


slurm_inputs = st.fixed_dictionaries(
    {
        "env": slurm_envs(),
        "args": st.lists(st.sampled_from(["--dataset", "synthetic", "--updates", "3", "*", "--bogus"]), max_size=3),
    }
)


SURFACES = [
    Surface("metrics-file-dense", fs.metrics_files(sparse=False), run_metrics, check_metrics),
    Surface("metrics-file-pairs", fs.metrics_files(sparse=True), run_metrics, check_metrics),
    Surface("allocate-cli", allocate_inputs, run_allocate, weight=0.5),
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
    Surface("train-dry-run", train_inputs, run_train_dry, weight=0.3),
    Surface("probe-flags", probe_inputs, run_probe_flags),
    Surface("experiment-flags", experiment_inputs, run_experiment_flags, check_experiment_dir),
    Surface("cpu-quota", quota_inputs, run_quotas, check_quotas),
    Surface("cpu-quota-schedule", QUOTA_SCHEDULES, run_quota_schedule, check_quota_schedule),
    Surface("max-batch", cap_inputs, run_caps, check_caps),
    Surface("tensorboard-dir", tensorboard_inputs, run_tensorboard, check_tensorboard_dir, weight=0.3),
    Surface("launcher-env", launcher_envs, run_launcher_env, check_launcher_env),
    Surface("slurm-job", slurm_inputs, run_slurm_job, check_slurm_job, weight=0.1),
]
