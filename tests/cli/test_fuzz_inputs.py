"""Every user-input surface fuzzed with Hypothesis (issue 15); the surfaces are in fuzz_surfaces.py.

The property (fuzz_property.py), for anything Hypothesis can build (text, bytes, deep nesting,
huge and tiny numbers, NaN/inf, unicode, empty files, odd file names): the parser returns a
*valid* result, or raises :class:`UsageError` whose message is one line. Nothing else: no other
exception, no warning, no hang. Then the regressions (each escape found, as one fixed input).
``test_fuzz_cli.py`` takes a few generated cases through the real CLI: as subprocesses, and
under mpirun with 4 ranks.

Budget: by default each surface runs ``CI_EXAMPLES x weight`` examples (a few seconds), with a
fixed seed and no example database. The long run spreads ``BNO_FUZZ_EXAMPLES`` examples over the
surfaces by weight, with a random seed; ``BNO_FUZZ_REPORT=FILE`` appends one JSON line per surface::

    BNO_FUZZ_EXAMPLES=100000 BNO_FUZZ_REPORT=fuzz.jsonl launch/test -k fuzz
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from support import fuzz_trees as ft
from support.fuzz_property import result_or_one_line
from support.fuzz_strategies import metrics_file
from support.fuzz_surfaces import SURFACES
from support.fuzz_trees import safe_to_import

from bno_hvd.common.errors import UsageError


def tier(surface):
    """launch/slurm-job is a bash script: its surface starts a process (setup.cfg's markers)."""
    return pytest.mark.slow if surface == "slurm-job" else ()


@pytest.mark.parametrize("surface", [pytest.param(s, id=s.name, marks=tier(s.name)) for s in SURFACES])
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
            result = result_or_one_line(lambda: surface.run(inp, directory), surface.time_limit)
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


@pytest.mark.parametrize("surface, inp, words", [pytest.param(*r[1:], id=r[0], marks=tier(r[1])) for r in REFUSED])
def test_escape_found_is_refused_in_one_line(surface, inp, words, tmp_path, fixture_modules):
    inp = inp() if callable(inp) else inp
    messages = []

    def call():
        try:
            return BY_NAME[surface].run(inp, tmp_path)
        except UsageError as err:
            messages.append(str(err))
            raise

    assert result_or_one_line(call, BY_NAME[surface].time_limit) is None, "accepted"
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


@pytest.mark.slow
def test_a_slurm_task_count_with_a_leading_zero_is_decimal(tmp_path):
    # slurm-job: a task count with a leading zero was octal to bash ("value too great for base")
    job = {"env": {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "08"}, "args": ["--updates", "3"]}
    slurm = BY_NAME["slurm-job"]
    assert result_or_one_line(lambda: slurm.run(job, tmp_path), slurm.time_limit) == 8
