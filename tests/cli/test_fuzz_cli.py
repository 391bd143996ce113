"""The fuzzed surfaces through the real CLI (issue 15): fixed refusals and generated flags as real
processes, and under mpirun with 2 ranks, where a refusal must end every rank with one line.

The in-process property, its surfaces and the regressions are in ``test_fuzz_inputs.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, given, settings
from support import fuzz_strategies as fs
from support import fuzz_surfaces as fsu
from support import fuzz_surfaces_cli as fcli
from support import fuzz_trees as ft
from support.fuzz_property import assert_cli_error, cli_result, result_or_one_line, write_file
from support.fuzz_strategies import metrics_file
from support.fuzz_trees import safe_to_import
from support.jobs import ROOT, bno_cmd, mpirun, run_cli

from bno_hvd.cli.main import main

DRY = ["train", "--dry-run", "--world-size", "2", "--dataset", "synthetic", "--no-progress"]


def metrics_path(directory: Path, raw: bytes) -> str:
    path = directory / "metrics.json"
    path.write_bytes(raw)
    return str(path)


CLI_REFUSED = [
    ("allocate: 100,000 levels", lambda d: ["allocate", "--metrics", metrics_path(d, b"[" * 100_000)], "too deeply"),
    (
        "allocate: 1e308",
        lambda d: ["allocate", "--metrics", metrics_path(d, metrics_file(ops=[1e308, 1e308])["content"])],
        "ops[0] is 1e+308; use samples/s between 0.001 and 1e+09",
    ),
    (
        "allocate: --base-batch-size 2**63",
        lambda d: [
            "allocate",
            "--metrics",
            metrics_path(d, metrics_file()["content"]),
            "--base-batch-size",
            str(2**63),
        ],
        "must be at most 1000000",
    ),
    ("--seed -1", lambda d: [*DRY, "--seed", "-1"], "--seed must be an integer between 0 and 4294967295"),
    ("--emulate-speed 1,1e-300", lambda d: [*DRY, "--emulate-speed", "1,1e-300"], "between 0.01 and 100"),
    ("speed x rate", lambda d: [*DRY, "--emulate-speed", "0.01,1", "--emulate-rate", "0.1"], "speed x rate must be >="),
    ("--latency-interval 1e-300", lambda d: [*DRY, "--latency-interval", "1e-300"], "between 0.01 and 86400"),
    ("--max-batch 2**63", lambda d: [*DRY, "--max-batch", str(2**63)], "every cap must be between 1 and 1e+06"),
    ("--world-size 10**9", lambda d: [*DRY, "--world-size", str(10**9)], "at most 65536"),
    ("--updates of 5000 digits", lambda d: [*DRY, "--updates", "1" * 5000], "is not a valid integer"),
    ("--prefetch-factor 10**6", lambda d: [*DRY, "--prefetch-factor", "1000000"], "between 1 and 64"),
]


@pytest.mark.parametrize("args, words", [c[1:] for c in CLI_REFUSED], ids=[c[0] for c in CLI_REFUSED])
def test_cli_refuses_in_one_line(args, words, tmp_path):
    result = result_or_one_line(lambda: cli_result(args(tmp_path)))
    assert result is None, "accepted"
    stderr = CliRunner().invoke(main, args(tmp_path)).stderr
    assert words in stderr, stderr


@pytest.mark.slow
def test_numbers_out_of_range_leave_stderr_one_line_in_a_real_process(tmp_path):
    # the 1e308 metrics file: numpy printed overflow warnings above an allocation of infinities
    proc = run_cli("allocate", "--metrics", metrics_path(tmp_path, metrics_file(ops=[1e308, 1e308])["content"]))
    assert_cli_error(proc.returncode, proc.stdout, proc.stderr)
    proc = run_cli("allocate", "--metrics", metrics_path(tmp_path, b"[" * 100_000 + b"]" * 100_000))
    assert_cli_error(proc.returncode, proc.stdout, proc.stderr)


def subprocess_env(fixture_dir) -> dict:
    return {"PYTHONPATH": os.pathsep.join([ROOT, str(fixture_dir)])}


FEW = settings(
    max_examples=3,
    deadline=None,
    database=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
)


def same_outcome_in_a_subprocess(args: list[str], fixture_dir) -> None:
    """``bno-hvd ARGS`` as a real process: the outcome CliRunner gave, and no more on stderr."""
    inner = CliRunner().invoke(main, args)
    proc = run_cli(*args, env=subprocess_env(fixture_dir), timeout=180)
    assert proc.returncode == inner.exit_code, (proc.returncode, inner.exit_code, proc.stderr[-2000:])
    if proc.returncode == 0:  # (allocate reports how long it took)
        assert re.sub(r'"seconds": [0-9.e-]+', "", proc.stdout) == re.sub(r'"seconds": [0-9.e-]+', "", inner.stdout)
    else:
        assert_cli_error(proc.returncode, proc.stdout, proc.stderr)
        assert proc.stderr.strip() == inner.stderr.strip()


@pytest.mark.slow
@FEW
@given(inp=fcli.train_inputs.filter(safe_to_import))
def test_train_dry_run_as_a_subprocess(inp, fixture_modules):
    directory = Path(tempfile.mkdtemp())
    try:
        same_outcome_in_a_subprocess(fcli.train_args(inp, directory) + ["--dry-run"], fixture_modules)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.slow
@FEW
@given(metrics=fs.metrics_files(sparse=False), hosts=fs.hostfiles)
def test_allocate_and_check_hostfile_as_subprocesses(metrics, hosts, fixture_modules):
    directory = Path(tempfile.mkdtemp())
    try:
        same_outcome_in_a_subprocess(["allocate", "--metrics", str(write_file(directory, metrics))], fixture_modules)
        hostfile = write_file(directory, hosts)
        same_outcome_in_a_subprocess(["check-hostfile", str(hostfile), "--no-resolve"], fixture_modules)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def error_lines(proc) -> list[str]:
    return [
        line.split("bno-hvd: error:", 1)[1]
        for line in (proc.stdout + proc.stderr).splitlines()
        if "bno-hvd: error:" in line
    ]


def assert_every_rank_ended_with_one_line(proc, expected: str | None = None) -> None:
    """mpirun returned (no hang: its timeout fails the test), one error line, no traceback."""
    output = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode != 0, output
    lines = error_lines(proc)
    assert len(lines) == 1, output
    assert "Traceback" not in proc.stdout + proc.stderr, output
    if expected is not None:
        assert lines[0].strip() == expected.strip(), (lines[0], expected)


@pytest.mark.mpi
@settings(FEW, max_examples=1)
@given(inp=fcli.mpirun_train_inputs.filter(safe_to_import))
def test_refused_flags_end_every_rank_under_mpirun(inp, fixture_modules):
    """Flags that a dry run for 2 ranks refuses: a real 2-rank job ends on every rank, one line."""
    directory = Path(tempfile.mkdtemp())
    try:
        args = fcli.train_args(inp, directory)
        if "--updates" not in args:
            args += ["--updates", "3"]
        dry = CliRunner().invoke(main, args + ["--dry-run", "--world-size", "2"])
        assume(dry.exit_code == 2)
        print("mpirun -np 2 bno-hvd", *args)
        proc = mpirun(2, bno_cmd(*args), timeout=240, env=subprocess_env(fixture_modules))
        assert_every_rank_ended_with_one_line(proc, dry.stderr.split("bno-hvd: error:", 1)[1])
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.mpi
@settings(FEW, max_examples=1)
@given(inp=ft.checkpoint_dirs.filter(lambda d: any(re.fullmatch(r"ckpt-\d{8}\.pt", n) for n, _ in d["files"])))
def test_foreign_checkpoint_ends_every_rank_under_mpirun(inp, fixture_modules):
    """Rank 0 alone reads the checkpoint: its refusal must reach the other 3 ranks (no hang)."""
    directory = Path(tempfile.mkdtemp())
    try:
        ck = fsu.build_checkpoint_dir(inp, directory)
        args = ["train", "--dataset", "synthetic", "--no-progress", "--no-eval", "--latency-interval", "0"]
        args += ["--updates", "2", "--checkpoint-dir", str(ck), "--resume"]
        print("mpirun -np 2 bno-hvd", *args, [name for name, _ in inp["files"]])
        proc = mpirun(2, bno_cmd(*args), timeout=240, env=subprocess_env(fixture_modules))
        assert_every_rank_ended_with_one_line(proc)  # a one-rank checkpoint never fits 2 ranks
    finally:
        shutil.rmtree(directory, ignore_errors=True)
