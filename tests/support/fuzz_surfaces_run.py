"""The run-time surfaces of :data:`fuzz_surfaces.SURFACES`: real slowness (CPU quotas and their
schedules), per-rank memory caps, TensorBoard directories, and the launchers' environments (the
rank and local size in Python, Slurm's job variables in ``launch/slurm-job``).
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import strategies as st
from support import fuzz_strategies as fs
from support.fuzz_property import assert_one_line, in_range, write_file
from support.fuzz_surfaces_cli import int_text, path_text
from support.jobs import CLI_TIMEOUT, ROOT

from bno_hvd.common import parsing
from bno_hvd.common.errors import UsageError


def run_quotas(inp, directory):
    """``--cpu-quota`` and ``--cpu-quota-period`` as ``train`` reads them: the shares, then their period."""
    from bno_hvd.lab.cpuquota import parse_quotas, period_for
    from bno_hvd.training.config import TrainConfig

    quotas = parse_quotas(inp["quotas"])
    cfg = TrainConfig(cpu_quota=tuple(quotas), cpu_quota_period_ms=inp["period_ms"])
    return quotas, period_for(parsing.RankSchedule.constant(quotas), cfg.cpu_quota_period_ms)


def check_quota_period(values, period) -> None:
    from bno_hvd.lab.cpuquota import MAX_PERIOD_US, MIN_QUOTA_US

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
    from bno_hvd.lab.cpuquota import load_quota_schedule, period_for

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
    from bno_hvd.cli.flags import config_from_flags

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

    from bno_hvd.training.config import TrainConfig
    from bno_hvd.training.runlog import check_output_paths
    from bno_hvd.training.tensorboard import TensorBoardHook

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
        label="no emulation: real ranks of this machine",
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
    from bno_hvd.processes.mpienv import YIELD, arrange_for_shared_cores, ranks_on_this_host
    from bno_hvd.processes.world import launched_rank

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


SLURM_JOB = Path(ROOT) / "launch" / "slurm-job"
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
            timeout=CLI_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"launch/slurm-job did not finish within {CLI_TIMEOUT:g} s (a hang)") from None
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
