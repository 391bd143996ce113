"""Every user-input surface fuzzed with Hypothesis (issue 15); the surfaces are in fuzz_surfaces.py.

The property (fuzz_property.py), for anything Hypothesis can build (text, bytes, deep nesting,
huge and tiny numbers, NaN/inf, unicode, empty files, odd file names): the parser returns a
*valid* result, or raises :class:`UsageError` whose message is one line. Nothing else: no other
exception, no warning, no hang. Then the regressions (each escape found, as one fixed input),
and a few generated cases through the real CLI: as subprocesses, and under mpirun with 4 ranks.

Budget: by default each surface runs ``CI_EXAMPLES x weight`` examples (a few seconds), with a
fixed seed and no example database. The long run spreads ``BNO_FUZZ_EXAMPLES`` examples over the
surfaces by weight, with a random seed; ``BNO_FUZZ_REPORT=FILE`` appends one JSON line per surface::

    BNO_FUZZ_EXAMPLES=100000 BNO_FUZZ_REPORT=fuzz.jsonl launch/test -k fuzz
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import fuzz_strategies as fs
import fuzz_surfaces as fsu
import fuzz_surfaces_cli as fcli
import fuzz_trees as ft
import pytest
from click.testing import CliRunner
from conftest import ROOT, bno_cmd, mpirun, run_cli
from fuzz_property import assert_cli_error, cli_result, result_or_one_line, write_file
from fuzz_surfaces import SURFACES
from hypothesis import HealthCheck, assume, given, settings

from bno_hvd.cli import main
from bno_hvd.errors import UsageError


@pytest.fixture(scope="module")
def fixture_modules(tmp_path_factory):
    """The user model modules --model may name (``bno_fuzz_models:ok``), importable here and in subprocesses."""
    where = tmp_path_factory.mktemp("fuzz_modules")
    (where / f"{ft.FIXTURE_MODULE}.py").write_text(ft.FIXTURE_SOURCE)
    (where / f"{ft.BROKEN_MODULE}.py").write_text(ft.BROKEN_SOURCE)
    sys.path.insert(0, str(where))
    yield where
    sys.path.remove(str(where))


def safe_to_import(inp) -> bool:
    """Model specs may only name our fixture modules: a random ``os:_exit`` must never run."""
    if not isinstance(inp, dict):
        return True
    specs = [inp.get("spec")] + [v for f, v in inp.get("flags", []) if f == "--model"]
    return all(_safe_spec(s) for s in specs if isinstance(s, str) and ":" in s)


def _safe_spec(spec: str) -> bool:
    import importlib.util

    top = spec.partition(":")[0].split(".")[0]
    if top in (ft.FIXTURE_MODULE, ft.BROKEN_MODULE):
        return True
    try:
        return importlib.util.find_spec(top) is None
    except (ValueError, ImportError):
        return True


@pytest.mark.parametrize("surface", SURFACES, ids=[s.name for s in SURFACES])
def test_fuzz_surface(surface, tmp_path_factory, fixture_modules):
    if surface.todo:
        pytest.skip(surface.todo)
    base = tmp_path_factory.mktemp(surface.name)
    long_run = bool(os.environ.get("BNO_FUZZ_EXAMPLES"))
    counts = {"results": 0, "refused": 0}
    started = time.monotonic()

    @settings(
        max_examples=surface.examples(),
        deadline=None,
        database=None,
        derandomize=not long_run,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(inp=surface.inputs.filter(safe_to_import))
    def holds(inp):
        directory = Path(tempfile.mkdtemp(dir=base))
        try:
            result = result_or_one_line(lambda: surface.run(inp, directory))
            counts["refused" if result is None else "results"] += 1
            if result is not None:
                surface.check(inp, result)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    try:
        holds()
    finally:
        report(surface.name, counts, time.monotonic() - started)


def report(name: str, counts: dict, seconds: float) -> None:
    """One line per surface: printed (``pytest -s``) and, with BNO_FUZZ_REPORT=FILE, appended there."""
    total = sum(counts.values())
    results, refused = counts["results"], counts["refused"]
    line = f"fuzz {name}: {total} examples ({results} results, {refused} refused) in {seconds:.0f} s"
    print(line)
    if os.environ.get("BNO_FUZZ_REPORT"):
        with open(os.environ["BNO_FUZZ_REPORT"], "a") as fh:
            fh.write(json.dumps({"surface": name, **counts, "seconds": round(seconds, 1)}) + "\n")


def test_every_surface_is_registered_once():
    names = [s.name for s in SURFACES]
    assert len(names) == len(set(names))
    assert all((s.todo is None) == (s.inputs is not None and s.run is not None) for s in SURFACES)
    assert all(s.weight > 0 for s in SURFACES)


# -- regressions: every escape the fuzzing found, as one fixed input ---------------------------
# (surface, input, words of the one-line refusal). Each failed on the code before its fix: a
# traceback, a message of several lines, a warning on stderr, a hang, or an accepted input.

BY_NAME = {s.name: s for s in SURFACES}


def metrics_file(raw=None, **fields):
    doc = {"ops": [100.0, 50.0], "memory_used": [1e9, 2e9], "latency": [[0, 1e-4], [1e-4, 0]], **fields}
    return {"name": "metrics.json", "content": raw if raw is not None else json.dumps(doc).encode()}


def schedule_file(content, n_ranks=2):
    return {"name": "schedule.json", "content": content.encode(), "n_ranks": n_ranks}


def torch_bytes(obj) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def checkpoint(change=None, directory="ck"):
    """A real checkpoint (one rank, default config) with ``change(state)`` applied to a copy;
    built when the test runs (it needs torch), so the table costs nothing at collection."""

    def build():
        import copy

        state = copy.deepcopy(ft.real_checkpoint_state())
        if change:
            change(state)
        return {"dir": directory, "files": [("ckpt-00000010.pt", torch_bytes(state))]}

    return build


def a_tensor():
    import torch

    return torch.zeros(3)


def loop_tree():
    return [("train/a/x.png", "file", b"\x89PNG"), ("train/a/up", "link", ".."), ("train/a/up2", "link", "..")]


def _set(path, value):
    def change(state):
        target = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value() if callable(value) else value

    return change


REFUSED = [
    ("metrics 100,000 levels deep", "metrics-file-dense", metrics_file(b"[" * 100_000 + b"]" * 100_000), "too deeply"),
    ("metrics ops 1e308", "metrics-file-dense", metrics_file(ops=[1e308, 1e308]), "between 0.001 and 1e+09"),
    ("metrics memory 1e308", "metrics-file-dense", metrics_file(memory_used=[1e308, 1]), "between 0 and 1e+18"),
    ("metrics latency 1e308", "metrics-file-dense", metrics_file(latency=[[0, 1e308], [1e308, 0]]), "0 and 60"),
    ("metrics 5000-digit literal", "metrics-file-dense", metrics_file(b"1" * 5000), "thousands of digits"),
    ("metrics unknown key \\x1e", "metrics-file-dense", metrics_file(**{"\x1e": 1}), "unknown key '\\x1e'"),
    ("metrics 5000-char key", "metrics-file-dense", metrics_file(**{"k" * 5000: 1}), "unknown key 'kkk"),
    ("max_batch Infinity", "metrics-file-dense", metrics_file(max_batch=[math.inf, None]), "max_batch[0] is inf"),
    ("max_batch 9.2e18", "metrics-file-dense", metrics_file(max_batch=[2.0**63, None]), "between 1 and 1e+06"),
    ("ops subnormal", "metrics-file-dense", metrics_file(ops=[2.2250738585e-313, 1]), "between 0.001 and 1e+09"),
    (
        "compute time 1e-179 s",
        "metrics-file-dense",
        metrics_file(compute_samples=[[], [[1, 1.27e-179]]]),
        "compute_samples[1][0]",
    ),
    (
        "compute 1.3e11 samples/s",
        "metrics-file-dense",
        metrics_file(compute_samples=[[], [[131055, 1e-6]]]),
        "samples/s",
    ),
    ("pair rank 1.5", "metrics-file-pairs", metrics_file(latency={"pairs": [[0, 1.5, 0.1]]}), "ranks are integers"),
    ("pair rank 10**30", "metrics-file-pairs", metrics_file(latency={"pairs": [[0, 10**30, 0.1]]}), "outside 0..1"),
    ("pair rank '1'", "metrics-file-pairs", metrics_file(latency={"pairs": [[0, "1", 0.1]]}), "pairs[0]"),
    ("slots=99999999999999999999", "hostfile", {"name": "h", "content": b"a slots=99999999999999999999"}, "1 and 4096"),
    ("hostfile named \\r", "hostfile", {"name": "\r", "content": b"localhost slots=0"}, "\\r' line 1"),
    ("hostname with NUL", "hostfile", {"name": "h", "content": b"a\x00b slots=1"}, "is not a host name"),
    (
        "schedule: two entries at one update",
        "emulate-schedule",
        schedule_file('[{"update": 0, "speeds": [1, 1]}, {"update": 0, "speeds": [1, 1]}]'),
        "two entries at update 0",
    ),
    (
        "schedule: speeds a string",
        "emulate-schedule",
        schedule_file('[{"update": 0, "speeds": "11"}]'),
        "list of numbers",
    ),
    (
        "schedule: speed 1e400",
        "emulate-schedule",
        schedule_file('[{"update": 0, "speeds": [1, 1' + "0" * 400 + "]}]"),
        "100",
    ),
    ("schedule: 5000 digits", "emulate-schedule", schedule_file("[" + "1" * 5000 + "]"), "thousands of digits"),
    ("--emulate-speed 1,1e-300", "emulate-speed", "1,1e-300", "between 0.01 and 100"),
    (
        "checkpoint: pickle protocol 0 (torch warned)",
        "checkpoint-dir",
        {"dir": "ck", "files": [("ckpt-00000000.pt", b"\x80\x00")]},
        "cannot be read",
    ),
    (
        "slurm: SLURM_HET_SIZE=1_000",
        "slurm-job",
        {"env": {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "1", "SLURM_HET_SIZE": "1_000"}, "args": []},
        "SLURM_HET_SIZE='1_000' is not a number of tasks",
    ),
    (
        "slurm: SLURM_JOB_ID \x1e",
        "slurm-job",
        {"env": {"SLURM_JOB_ID": "\x1e", "SLURM_NTASKS": "1"}, "args": []},
        "is not a Slurm job id",
    ),
    (
        "checkpoint of None",
        "checkpoint-dir",
        lambda: {"dir": "ck", "files": [("ckpt-00000010.pt", torch_bytes(None))]},
        "not a",
    ),
    ("config None", "checkpoint-dir", checkpoint(_set(["config"], None)), "not a bno-hvd checkpoint"),
    ("config tensor", "checkpoint-dir", checkpoint(_set(["config", "model"], a_tensor)), "<a Tensor>"),
    ("rng damaged", "checkpoint-dir", checkpoint(_set(["rng", 0, "numpy"], None)), "damaged RNG states"),
    ("rng entry a tensor (torch warned)", "checkpoint-dir", checkpoint(_set(["rng", 0], a_tensor)), "damaged RNG"),
    ("plan None", "checkpoint-dir", checkpoint(_set(["balancer", "plan"], None)), "not a bno-hvd checkpoint"),
    ("plan lag None", "checkpoint-dir", checkpoint(_set(["balancer", "plan", "lag"], None)), "does not fit this run"),
    ("plan a tensor", "checkpoint-dir", checkpoint(_set(["balancer", "plan"], a_tensor)), "not a bno-hvd checkpoint"),
    (
        "param_groups a tensor (torch warned)",
        "checkpoint-dir",
        checkpoint(_set(["optimizer", "param_groups"], a_tensor)),
        "not a bno-hvd checkpoint",
    ),
    (
        "strategy name with a line break",
        "checkpoint-dir",
        checkpoint(_set(["balancer", "strategy", "strategy"], "a\nb")),
        'checkpoint holds strategy "a\\nb"',
    ),
    (
        "model spec with \\r",
        "model-spec",
        {"spec": "bno_fuzz_models:\r", "num_classes": 10, "shape": (1, 28, 28)},
        "'\\r'",
    ),
    (
        "model raising a 3-line error",
        "model-spec",
        {"spec": "bno_fuzz_models:raises", "num_classes": 10, "shape": (1, 28, 28)},
        "first line second line third",
    ),
    ("image folder symlink loop", "image-folder", {"tree": loop_tree(), "image_size": 8}, "(a loop)"),
    ("image size 10**9", "image-folder", {"tree": [("train/a", "dir", b"")], "image_size": 10**9}, "1 and 4096"),
]


@pytest.mark.parametrize("surface, inp, words", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_escape_found_is_refused_in_one_line(surface, inp, words, tmp_path, fixture_modules):
    inp = inp() if callable(inp) else inp
    messages = []

    def call():
        try:
            return BY_NAME[surface].run(inp, tmp_path)
        except UsageError as err:
            messages.append(str(err))
            raise

    assert result_or_one_line(call) is None, "accepted"
    assert words in messages[0], messages[0]


def test_escapes_found_with_a_valid_answer(tmp_path, fixture_modules):
    # a byte-order mark (Windows editors) is not part of the first hostname
    hosts, _, _ = result_or_one_line(
        lambda: BY_NAME["hostfile"].run({"name": "h", "content": "\ufefflocalhost slots=2\n".encode()}, tmp_path)
    )
    assert [(h.hostname, h.slots) for h in hosts] == [("localhost", 2)]
    # a checkpoint directory whose name holds glob characters was searched as a pattern: resumed nothing
    found, resumed = result_or_one_line(lambda: BY_NAME["checkpoint-dir"].run(checkpoint(directory="[ck]")(), tmp_path))
    assert found is not None and resumed == 10
    # an unreadable image under a class folder named with a line break: one line from the loader
    tree = [("train/a\nb/x.png", "file", b"not a png"), ("train/a\nb/y.png", "file", ft.tiny_png())]
    tree += [("val/a\nb/y.png", "file", ft.tiny_png())]
    data, batches = result_or_one_line(lambda: BY_NAME["image-folder"].run({"tree": tree, "image_size": 8}, tmp_path))
    assert batches[0].error is not None and "\\n" in batches[0].error and "\n" not in batches[0].error
    # a TIFF cut after its header: PIL warned "Corrupt EXIF data" on stderr (two lines per sample);
    # now one line in the balancer's warning channel (the read itself fails: the loader's error)
    tree = [("train/a/x.png", "file", ft.tiny_png()), ("val/a/x.png", "file", ft.tiny_png())]
    tree += [("val/a/y.tif", "file", b"II*\x00\x08\x00\x00\x00")]
    (tmp_path / "tiff").mkdir()
    run = BY_NAME["image-folder"].run
    data, batches = result_or_one_line(lambda: run({"tree": tree, "image_size": 8}, tmp_path / "tiff"))
    assert batches[1].error is not None and "y.tif" in batches[1].error
    # launcher counts int() refuses (5000 digits, a superscript two that str.isdigit accepts) failed
    # inside MPI start-up; they are "not set", so the next variable (or the default) counts
    run = BY_NAME["launcher-env"].run
    assert result_or_one_line(lambda: run({"OMPI_COMM_WORLD_RANK": "1" * 5000, "PMI_RANK": "3"}, tmp_path))[0] == 3
    assert result_or_one_line(lambda: run({"OMPI_COMM_WORLD_LOCAL_SIZE": "\u00b2"}, tmp_path))[1] is None
    # slurm-job: a task count with a leading zero was octal to bash ("value too great for base")
    job = {"env": {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "08"}, "args": ["--updates", "3"]}
    assert result_or_one_line(lambda: BY_NAME["slurm-job"].run(job, tmp_path)) == 8


# -- the same through the real CLI ---------------------------------------------------------------

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


@FEW
@given(inp=fcli.train_inputs.filter(safe_to_import))
def test_train_dry_run_as_a_subprocess(inp, fixture_modules):
    directory = Path(tempfile.mkdtemp())
    try:
        same_outcome_in_a_subprocess(fcli.train_args(inp, directory) + ["--dry-run"], fixture_modules)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


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


@settings(FEW, max_examples=1)
@given(inp=fcli.mpirun_train_inputs.filter(safe_to_import))
def test_refused_flags_end_every_rank_under_mpirun(inp, fixture_modules):
    """Flags that a dry run for 4 ranks refuses: a real 4-rank job ends on every rank, one line."""
    directory = Path(tempfile.mkdtemp())
    try:
        args = fcli.train_args(inp, directory)
        if "--updates" not in args:
            args += ["--updates", "3"]
        dry = CliRunner().invoke(main, args + ["--dry-run", "--world-size", "4"])
        assume(dry.exit_code == 2)
        print("mpirun -np 4 bno-hvd", *args)
        proc = mpirun(4, bno_cmd(*args), timeout=240, env=subprocess_env(fixture_modules))
        assert_every_rank_ended_with_one_line(proc, dry.stderr.split("bno-hvd: error:", 1)[1])
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@settings(FEW, max_examples=1)
@given(inp=ft.checkpoint_dirs.filter(lambda d: any(re.fullmatch(r"ckpt-\d{8}\.pt", n) for n, _ in d["files"])))
def test_foreign_checkpoint_ends_every_rank_under_mpirun(inp, fixture_modules):
    """Rank 0 alone reads the checkpoint: its refusal must reach the other 3 ranks (no hang)."""
    directory = Path(tempfile.mkdtemp())
    try:
        ck = fsu.build_checkpoint_dir(inp, directory)
        args = ["train", "--dataset", "synthetic", "--no-progress", "--no-eval", "--latency-interval", "0"]
        args += ["--updates", "2", "--checkpoint-dir", str(ck), "--resume"]
        print("mpirun -np 4 bno-hvd", *args, [name for name, _ in inp["files"]])
        proc = mpirun(4, bno_cmd(*args), timeout=240, env=subprocess_env(fixture_modules))
        assert_every_rank_ended_with_one_line(proc)  # a one-rank checkpoint never fits 4 ranks
    finally:
        shutil.rmtree(directory, ignore_errors=True)
