"""The command-line surfaces of :data:`fuzz_surfaces.SURFACES`: ``train --dry-run`` (TrainConfig and
everything ``prepare()`` checks), the same flags under mpirun, ``allocate``, ``probe`` and ``experiment``.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import strategies as st
from support import fuzz_strategies as fs
from support import fuzz_trees as ft
from support.fuzz_property import cli_result, write_file

from bno_hvd.allocation import STRATEGY_NAMES
from bno_hvd.common import parsing


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
    from bno_hvd.cli.allocate import check_probe_flags

    check_probe_flags(**inp)
    return True


probe_ints = st.one_of(st.integers(-2, 70), st.sampled_from(EDGE_INTS), st.integers())
probe_inputs = st.fixed_dictionaries(
    {k: probe_ints for k in ("steps", "batch_size", "probe_bytes", "repeats", "threads")}
    | {"max_rounds": st.one_of(st.none(), probe_ints)}
)


def run_experiment_flags(inp, directory):
    """``bno-hvd experiment``'s own checks (TrainConfig's are train-dry-run's); --out is created."""
    from bno_hvd.cli.experiment import check_experiment

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
