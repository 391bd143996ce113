"""The GPU check's own logic, on the CPU (``launch/gpu-check``, bno_hvd/lab/gpucheck.py): its report
(JSON schema and Markdown from given part results), its parts (every test they select exists,
budgets within 8 minutes), its refusal without a GPU, its time budget with tiny fake parts, its
dry run, and the shares of a GPU between ranks (bno_hvd/lab/gpushares.py)."""

import ast
import json
import os
import subprocess
import sys
import time

import pytest
from support.jobs import ROOT

from bno_hvd.common.errors import UsageError
from bno_hvd.lab import gpucheck, gpuparts
from bno_hvd.lab.gpucheck import dry_run, run_check, status_of, write_report
from bno_hvd.lab.gpuparts import Part, check_parts
from bno_hvd.lab.gpureport import PartResult, Target, junit_outcomes, markdown, report_dict, validate_report
from bno_hvd.lab.gpushares import describe, parse_spec, rank_env

RESULTS = [
    PartResult("environment", "the GPU", "pass", 2.04, 20, 0, {"gpu": "NVIDIA H200", "sms": 132}),
    PartResult(
        "exact-batchnorm",
        "exact BatchNorm",
        "fail",
        61.0,
        85,
        1,
        {"mlp_vs_one": 2.5e-15, "resnet18_vs_one": 0.31},
        {"passed": 1, "failed": 1, "skipped": 0},
        ["test_x[resnet18]: assert 0.31 | 1e-10"],
        "exact-batchnorm/log.txt",
    ),  # fmt: skip
    PartResult("shared-gpu", "shares", "timeout", 130.2, 120, None, {}, {}, [], "shared-gpu/log.txt", "stopped"),
    PartResult("ddp-example", "the example", "skip", 0.0, 40, note="no time left"),
]
TARGETS = [
    Target("exact BatchNorm, MLP", "exact-batchnorm", "mlp_vs_one", "<=", 1e-10),
    Target("exact BatchNorm, resnet18", "exact-batchnorm", "resnet18_vs_one", "<=", 1e-10),
    Target("balanced / top peer", "shared-gpu", "balanced_vs_top_peer", ">=", 0.97),
]


def doc():
    return report_dict(
        RESULTS, TARGETS, date="2026-11-28", commit="abc1234", machine={"gpu": "NVIDIA H200", "torch": "2.11.0"},
        budget_s=465, seconds=193.24,
    )  # fmt: skip


def test_the_report_keeps_its_schema_through_json():
    report = json.loads(json.dumps(doc()))
    validate_report(report)
    assert [p["status"] for p in report["parts"]] == ["pass", "fail", "timeout", "skip"]
    assert [(t["value"], t["met"]) for t in report["targets"]] == [(2.5e-15, True), (0.31, False), (None, None)]
    assert report["seconds"] == 193.2 and report["schema"] == 1 and report["parts"][2]["returncode"] is None
    for broken in ({"status": "hung"}, {"seconds": "61"}, {"extra": 1}):
        bad = json.loads(json.dumps(doc()))
        bad["parts"][1].update(broken)
        with pytest.raises(ValueError):
            validate_report(bad)
    del report["targets"]
    with pytest.raises(ValueError, match="keys"):
        validate_report(report)


def test_the_markdown_table_of_given_results():
    assert markdown(doc()).splitlines() == [
        "GPU check of `abc1234` on 2026-11-28 (NVIDIA H200, 2.11.0): 1 of 4 parts passed in 193 s (budget 465 s).",
        "",
        "| part | status | seconds (budget) | tests passed/failed/skipped | measured |",
        "|---|---|---|---|---|",
        "| environment | **pass** | 2.0 (20) | - | gpu NVIDIA H200, sms 132 |",
        "| exact-batchnorm | **fail** | 61.0 (85) | 1/1/0 | mlp_vs_one 2.50e-15, resnet18_vs_one 0.31; "
        "test_x[resnet18]: assert 0.31 \\| 1e-10 |",
        "| shared-gpu | **timeout** | 130.2 (120) | - | stopped |",
        "| ddp-example | **skip** | 0.0 (40) | - | no time left |",
        "",
        "| target | part | measured | met |",
        "|---|---|---|---|",
        "| exact BatchNorm, MLP (<= 1.00e-10) | exact-batchnorm | 2.50e-15 | yes |",
        "| exact BatchNorm, resnet18 (<= 1.00e-10) | exact-batchnorm | 0.31 | **no** |",
        "| balanced / top peer (>= 0.97) | shared-gpu | - | not measured |",
    ]


def test_pytests_junit_gives_counts_failures_and_recorded_numbers():
    xml = (
        '<testsuites><testsuite><testcase name="test_a"><properties><property name="diff" value="1.5e-12"/>'
        '<property name="passes" value="3"/><property name="mps" value="no: none"/></properties></testcase>'
        '<testcase name="test_b"><skipped message="no CUDA"/></testcase>'
        '<testcase name="test_c"><failure message="AssertionError: boom&#10;assert 1 == 2">...</failure></testcase>'
        '<testcase name="test_d"><error message="fixture failed">...</error></testcase></testsuite></testsuites>'
    )
    counts, failures, numbers = junit_outcomes(xml)
    assert counts == {"passed": 1, "failed": 2, "skipped": 1}
    assert failures == ["test_c: AssertionError: boom", "test_d: fixture failed"]
    assert numbers == {"diff": 1.5e-12, "passes": 3, "mps": "no: none"}


@pytest.mark.parametrize(
    "returncode,timed_out,counts,expected",
    [
        (0, False, {"passed": 3, "failed": 0, "skipped": 1}, "pass"),
        (0, False, {"passed": 0, "failed": 0, "skipped": 4}, "skip"),  # no GPU after all
        (5, False, {}, "skip"),  # pytest selected no test
        (1, False, {"passed": 2, "failed": 1, "skipped": 0}, "fail"),
        (0, False, {}, "pass"),  # not a pytest part
        (None, True, {"passed": 1, "failed": 0, "skipped": 0}, "timeout"),
    ],
)
def test_a_parts_status(returncode, timed_out, counts, expected):
    assert status_of(returncode, timed_out, counts) == expected


def defined_tests(path):
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_the_parts_select_tests_that_exist_within_eight_minutes():
    parts = check_parts("python3")
    assert sum(p.budget_s for p in parts) <= gpuparts.TOTAL_BUDGET_S <= 8 * 60
    assert [p.name for p in parts][:2] == ["environment", "install"] and len({p.name for p in parts}) == len(parts)
    names = {t.part for t in gpuparts.TARGETS}
    assert names <= {p.name for p in parts}
    for part in parts[2:]:
        assert part.argv[:3] == ("python3", "-m", "pytest") and "{dir}/junit.xml" in part.argv
        for arg in part.argv:
            path, _, test = arg.partition("::")
            if path.startswith("tests/"):
                assert os.path.exists(os.path.join(ROOT, path)), arg
                assert not test or test in defined_tests(path), arg


def test_the_dry_run_lists_every_part_with_its_budget(capsys):
    assert gpucheck.main(["out", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "gpu-check would run 7 parts within 465 s in all (each at most its budget):"
    for part in check_parts():
        line = next(line for line in out if line.split()[:1] == [part.name])
        assert f" {part.budget_s:.0f} s  {part.what}" in line
    assert out[-1] == f"  budgets sum to {sum(p.budget_s for p in check_parts()):.0f} s"
    assert dry_run(check_parts(), 100).startswith("gpu-check would run 7 parts within 100 s")


def test_without_a_gpu_it_refuses_in_one_line(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpucheck.main([str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpu-check: no CUDA device here") and "--dry-run" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        ([], "give OUT"),
        (["out", "--only", "exact-batchnorm,warp-drive"], "--only warp-drive: no such part"),
        (["out", "--total", "0"], "--total 0 must be"),
        (["out", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_user_errors_are_one_line(argv, message, capsys):
    assert gpucheck.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_the_shares_of_a_gpu_per_rank():
    assert parse_spec("gpu:100,gpu,cpu") == [("gpu", 100), ("gpu", None), ("cpu", None)]
    assert rank_env("gpu:100,gpu:15,cpu", 1) == {"LOCAL_RANK": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "15"}
    assert rank_env("gpu:100,gpu:15,cpu", 2) == {"CUDA_VISIBLE_DEVICES": ""}
    assert rank_env("gpu,cpu", 0) == {"LOCAL_RANK": "0"}
    assert describe("gpu:100,gpu:50,gpu:25,gpu:10") == "4 ranks on one GPU under MPS at 100,50,25,10% of its SMs"
    assert describe("gpu,cpu,cpu,cpu") == "1 rank(s) on the GPU beside 3 on the CPU"
    for bad, message in (("gpu:0", "from 1 to 100"), ("cpu:5", "gpu, gpu:PERCENT or cpu"), ("tpu", "per rank")):
        with pytest.raises(UsageError, match=message):
            parse_spec(bad)
    with pytest.raises(UsageError, match="2 entries for local rank 2"):
        rank_env("gpu,cpu", 2)


PY = sys.executable


@pytest.mark.slow
def test_a_part_past_its_budget_is_stopped_and_the_others_still_run(tmp_path):
    # a part whose child ignores SIGINT and leaves a grandchild of its own session: all of it ends
    stubborn = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        f"open({str(tmp_path / 'pid')!r}, 'w').write(str(subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)'], start_new_session=True).pid)); time.sleep(60)"
    )
    numbers = (
        "import json, os; json.dump({'answer': 42}, open(os.environ['GPU_CHECK_PART_DIR'] + '/numbers.json', 'w'))"
    )
    parts = [
        Part("sleeper", "sleeps past its budget", (PY, "-c", "import time; time.sleep(60)"), 1),
        Part("stubborn", "ignores SIGINT", (PY, "-c", stubborn), 1.5),
        Part("quick", "measures a number", (PY, "-c", numbers), 10),
        Part("failing", "exits 3", (PY, "-c", "raise SystemExit(3)"), 10),
        Part("hog", "gets what is left of the whole", (PY, "-c", "import time; time.sleep(60)"), 60),
        Part("late", "finds no time left", (PY, "-c", "pass"), 10),
    ]
    out = tmp_path / "out"
    start = time.monotonic()
    results = run_check(parts, str(out), total_s=9, grace_s=1, min_start_s=1, echo=lambda m: None)
    assert time.monotonic() - start < 15
    assert [r.status for r in results] == ["timeout", "timeout", "pass", "fail", "timeout", "skip"]
    assert results[4].budget_s < 9 and results[4].seconds < 10  # the whole budget's rest, not its own
    assert results[0].returncode is None and 1 <= results[0].seconds < 4 and "budget of 1 s" in results[0].note
    assert results[2].numbers == {"answer": 42} and results[3].returncode == 3 and results[5].note == "no time left"
    grandchild = int((tmp_path / "pid").read_text())
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):  # killed with its grandparent's tree
        os.kill(grandchild, 0)
    assert (out / "sleeper" / "log.txt").read_text().startswith(f"$ {PY} -c")
    report = write_report(str(out), results, commit="abc1234", dirty=True, total_s=16, seconds=12.0)
    validate_report(json.loads((out / "report.json").read_text()))
    assert report["parts"][0]["log"] == "sleeper/log.txt"
    assert "| sleeper | **timeout** |" in (out / "report.md").read_text()


@pytest.mark.slow
def test_the_launch_script_refuses_without_a_gpu_and_dry_runs(tmp_path):
    env = {**os.environ, "PYTHON": PY, "CUDA_VISIBLE_DEVICES": ""}  # no GPU seen, also on a GPU machine
    proc = subprocess.run([f"{ROOT}/launch/gpu-check", str(tmp_path / "out")], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("gpu-check: no CUDA device here"), proc.stderr
    dry = subprocess.run([f"{ROOT}/launch/gpu-check", "out", "--dry-run"], capture_output=True, text=True, env=env)
    assert dry.returncode == 0 and "budgets sum to 465 s" in dry.stdout and not (tmp_path / "out").exists()
