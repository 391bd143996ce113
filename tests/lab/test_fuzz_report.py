"""``bno-hvd report LOGDIR`` on damaged logs, fuzzed (a surface the first long fuzz run did not cover).

The logs are those of a real experiment (2 ranks under horovodrun, shared: conftest.py). Each
example damages one or two of its files the way a disk, an editor or another program might: a
JSON value replaced or removed, a file cut short or spliced with odd bytes, a line of
``updates.jsonl`` changed, a file deleted. The property (fuzz_property.py): the report is written,
or ``UsageError`` with a one-line message; no other exception, no warning, no hang. Where the
report is written, its summary holds one row per run with every column.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import fuzz_strategies as fs
from support.fuzz_property import cli_result, result_or_one_line
from support.fuzz_surfaces import CI_EXAMPLES

from bno_hvd.lab.averages import SUMMARY_COLUMNS
from bno_hvd.lab.report import write_experiment_report

# reads the experiment shared with test_experiment.py (conftest.py); its outcome depends on speed: runs alone
pytestmark = pytest.mark.alone

RUNS = ("equal", "balanced")
EXAMPLES = int(os.environ.get("BNO_FUZZ_REPORT_EXAMPLES", CI_EXAMPLES // 3))  # each writes CSVs and PNGs


@pytest.fixture(scope="module")
def logs(tiny_experiment) -> Path:
    return tiny_experiment[0]  # conftest.py: shared with test_experiment.py and test_stragglers.py


def log_files(root: Path) -> dict[str, bytes]:
    """What `report` reads: experiment.json and every run's four logs (relative path -> bytes)."""
    names = ["experiment.json"] + [
        f"runs/cnn/{run}/{name}" for run in RUNS for name in ("run.json", "updates.jsonl", "result.json", "ranks.json")
    ]
    return {name: (root / name).read_bytes() for name in names}


@st.composite
def damaged(draw, content: bytes, name: str):
    """``content`` of the file ``name`` with one kind of damage (None: the file is deleted)."""
    kind = draw(st.sampled_from(["value", "value", "value", "bytes", "delete"]))
    if kind == "delete":
        return None
    if name.endswith(".jsonl"):
        lines = content.decode().splitlines()
        at = draw(st.integers(0, len(lines) - 1))
        if kind == "value":
            lines[at] = fs.dumps(draw(fs.mutated(st.just(json.loads(lines[at])))))
        else:
            lines[at] = draw(fs.spliced(st.just(lines[at]))).decode("utf-8", "replace")
        return ("\n".join(lines) + "\n").encode()
    doc = json.loads(content)
    if kind == "value":
        return fs.dumps(draw(fs.mutated(st.just(doc)))).encode()
    return draw(fs.json_file(st.just(doc)))


@st.composite
def damages(draw, files: dict[str, bytes]):
    """One or two files of ``files``, damaged: {relative path: new bytes or None}."""
    names = draw(st.lists(st.sampled_from(sorted(files)), min_size=1, max_size=2, unique=True))
    return {name: draw(damaged(files[name], name)) for name in names}


def apply(root: Path, damage: dict) -> None:
    for name, content in damage.items():
        if content is None:
            (root / name).unlink()
        else:
            (root / name).write_bytes(content)


def check_report(root: Path, rows: list[dict]) -> None:
    assert rows and all(set(SUMMARY_COLUMNS) <= set(row) for row in rows)
    summary = json.loads((root / "summary.json").read_text())
    assert [(r["model"], r["strategy"]) for r in summary["runs"]] == [(r["model"], r["strategy"]) for r in rows]
    for row in rows:
        for key in ("compute_balance", "compute_balance_of_means", "outside_compute_share", "final_accuracy"):
            assert row[key] is None or 0 <= row[key] <= 1, (key, row[key])


@pytest.mark.mpi
def test_report_of_the_undamaged_logs(logs, tmp_path):
    root = tmp_path / "logs"
    shutil.copytree(logs, root)
    rows = result_or_one_line(lambda: write_experiment_report(str(root), warn=lambda m: None))
    assert rows is not None
    check_report(root, rows)
    assert {r["strategy"] for r in rows} == set(RUNS) and all(r["status"] == "ok" for r in rows)


@pytest.mark.mpi
@pytest.mark.filterwarnings("ignore:Generating overly large repr")  # (Hypothesis, of a whole damaged file)
def test_fuzz_report_on_damaged_logs(logs, tmp_path_factory):
    files = log_files(logs)
    base = tmp_path_factory.mktemp("damaged")
    counts = {"results": 0, "refused": 0}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=not os.environ.get("BNO_FUZZ_REPORT_EXAMPLES"),
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(damage=damages(files))
    def holds(damage):
        root = Path(tempfile.mkdtemp(dir=base)) / "logs"
        try:
            shutil.copytree(logs, root)
            apply(root, damage)
            rows = result_or_one_line(lambda: write_experiment_report(str(root), warn=lambda m: None))
            counts["refused" if rows is None else "results"] += 1
            if rows is not None:
                check_report(root, rows)
        finally:
            shutil.rmtree(root.parent, ignore_errors=True)

    holds()
    print(f"fuzz report: {sum(counts.values())} examples ({counts['results']} results, {counts['refused']} refused)")
    assert counts["results"] > 0 and counts["refused"] > 0  # both kinds of damage were reached


@pytest.mark.mpi
def test_the_cli_on_damaged_logs(logs, tmp_path):
    """Through ``bno-hvd report``: exit 0, or exit 2 with one ``bno-hvd: error:`` line."""
    cases = {
        "run.json gone": {"runs/cnn/equal/run.json": None},
        "result.json a list": {"runs/cnn/balanced/result.json": b"[1, 2]"},
        "experiment.json cut": {"experiment.json": (logs / "experiment.json").read_bytes()[:40]},
        "ranks.json of text": {"runs/cnn/equal/ranks.json": b'{"batch": "x"}'},
    }
    for name, damage in cases.items():
        root = tmp_path / name.replace(" ", "_")
        shutil.copytree(logs, root)
        apply(root, damage)
        cli_result(["report", str(root)])


def test_ranks_json_of_both_formats(tmp_path):
    """read_steps checks, then reads through records.steps_from_json: the older format too."""
    from bno_hvd.lab.logread import read_steps

    path = tmp_path / "ranks.json"
    path.write_text(json.dumps({"rank_steps": [[[8, 0.1, 0.0]], [[4, 0.2, 0.01]]]}))  # before the columns
    steps, why = read_steps(str(path))
    assert why is None and [[(s.batch, s.compute, s.rebalance) for s in r] for r in steps] == [
        [(8, 0.1, 0.0)],
        [(4, 0.2, 0.01)],
    ]
    path.write_text(json.dumps({"rank_steps": [[[8, "x", 0.0]]]}))
    assert read_steps(str(path))[0] is None and "rank_steps" in read_steps(str(path))[1]
