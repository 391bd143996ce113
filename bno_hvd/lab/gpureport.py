"""The GPU check's report (:mod:`bno_hvd.lab.gpucheck`): what each part did, as JSON a program reads
and as the Markdown that docs/data-and-models.md shows. Pure: part results in, text out.

``report.json`` (schema 1)::

    {"schema": 1, "check": "bno-hvd gpu-check", "date": "2026-11-28", "commit": "2b235b6",
     "dirty": false, "machine": {"gpu": "NVIDIA H200", ...}, "budget_s": 465, "seconds": 431.2,
     "parts": [{"name": "exact-batchnorm", "what": "...", "status": "pass", "seconds": 61.0,
                "budget_s": 80, "returncode": 0, "numbers": {"ddp_mlp_diff": 1.2e-15},
                "tests": {"passed": 3, "failed": 0, "skipped": 0}, "failures": [],
                "log": "exact-batchnorm/log.txt", "note": ""}, ...],
     "targets": [{"what": "...", "part": "exact-batchnorm", "number": "ddp_mlp_diff", "op": "<=",
                  "threshold": 1e-10, "value": 1.2e-15, "met": true}, ...]}

A part's ``status`` is one of :data:`STATUSES`: ``pass`` (it exited 0), ``fail`` (it exited
otherwise), ``skip`` (it ran no test, or every test skipped, or no time was left for it) and
``timeout`` (it ran past its budget and was stopped). A target is ``met`` true or false, or None
where its part measured no such number.

Usage::

    doc = report_dict(results, TARGETS, date="2026-11-28", commit="2b235b6", machine={}, budget_s=465, seconds=431.2)
    validate_report(doc)
    print(markdown(doc))
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field

SCHEMA = 1
STATUSES = ("pass", "fail", "skip", "timeout")


@dataclass
class PartResult:
    """What one part of the check did (seconds: wall time, budget included)."""

    name: str
    what: str
    status: str
    seconds: float
    budget_s: float
    returncode: int | None = None  # None: it did not end by itself (timeout) or never started (skip)
    numbers: dict = field(default_factory=dict)  # what it measured: name -> number (or short text)
    tests: dict = field(default_factory=dict)  # pytest's counts: passed, failed, skipped
    failures: list = field(default_factory=list)  # "test: first line of its failure", a few
    log: str = ""  # its output, relative to the report's folder
    note: str = ""  # one line: why it was skipped or stopped

    def __post_init__(self):
        assert self.status in STATUSES, self.status


@dataclass(frozen=True)
class Target:
    """A number a part must measure, and the bound it must keep (``op``: ``<=`` or ``>=``)."""

    what: str
    part: str
    number: str
    op: str
    threshold: float

    def judge(self, results: list[PartResult]) -> dict:
        value = next((r.numbers.get(self.number) for r in results if r.name == self.part), None)
        met = None
        if isinstance(value, (int, float)) and math.isfinite(value):
            met = value <= self.threshold if self.op == "<=" else value >= self.threshold
        return {**asdict(self), "value": value, "met": met}


def junit_outcomes(xml_text: str, keep: int = 5) -> tuple[dict, list[str], dict]:
    """From pytest's JUnit XML: ``(counts, failures, numbers)``: passed/failed/skipped counts, the
    first ``keep`` failures as "test: first line", and every ``record_property`` of every test
    (numbers where they parse as one)."""
    counts, failures, numbers = {"passed": 0, "failed": 0, "skipped": 0}, [], {}
    for case in ET.fromstring(xml_text).iter("testcase"):
        bad = case.find("failure")
        bad = bad if bad is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            first = (bad.get("message") or bad.text or "").strip().splitlines()
            failures.append(f"{case.get('name')}: {first[0][:200] if first else bad.tag}")
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
        for prop in case.iter("property"):
            numbers[prop.get("name")] = _number(prop.get("value"))
    return counts, failures[:keep], numbers


def _number(text: str | None):
    try:
        return int(text)
    except (TypeError, ValueError):
        pass
    try:
        return float(text)
    except (TypeError, ValueError):
        return text


def report_dict(results, targets, *, date, commit, machine, budget_s, seconds, dirty=False) -> dict:
    """The report as one JSON-ready dict (schema in the module docstring)."""
    return {
        "schema": SCHEMA,
        "check": "bno-hvd gpu-check",
        "date": date,
        "commit": commit,
        "dirty": bool(dirty),
        "machine": dict(machine),
        "budget_s": budget_s,
        "seconds": round(seconds, 1),
        "parts": [asdict(r) for r in results],
        "targets": [t.judge(results) for t in targets],
    }


PART_KEYS = {
    "name": str,
    "what": str,
    "status": str,
    "seconds": (int, float),
    "budget_s": (int, float),
    "returncode": (int, type(None)),
    "numbers": dict,
    "tests": dict,
    "failures": list,
    "log": str,
    "note": str,
}
TOP_KEYS = {
    "schema": int,
    "check": str,
    "date": str,
    "commit": str,
    "dirty": bool,
    "machine": dict,
    "budget_s": (int, float),
    "seconds": (int, float),
    "parts": list,
    "targets": list,
}


def validate_report(doc: dict) -> None:
    """Raises ValueError where ``doc`` is not a report of :data:`SCHEMA` (keys, types, statuses)."""
    _keys(doc, TOP_KEYS, "report")
    if doc["schema"] != SCHEMA:
        raise ValueError(f"report: schema {doc['schema']}, expected {SCHEMA}")
    for part in doc["parts"]:
        _keys(part, PART_KEYS, f"part {part.get('name')!r}")
        if part["status"] not in STATUSES:
            raise ValueError(f"part {part['name']!r}: status {part['status']!r} is not one of {STATUSES}")
    for target in doc["targets"]:
        if set(target) != {"what", "part", "number", "op", "threshold", "value", "met"}:
            raise ValueError(f"target {target.get('what')!r}: keys {sorted(target)}")


def _keys(doc: dict, expected: dict, where: str) -> None:
    if set(doc) != set(expected):
        raise ValueError(f"{where}: keys {sorted(doc)}, expected {sorted(expected)}")
    for key, kind in expected.items():
        if not isinstance(doc[key], kind) or (kind is int and isinstance(doc[key], bool)):
            raise ValueError(f"{where}: {key} is {type(doc[key]).__name__}")


def show(value) -> str:
    """A measured value as the table shows it: 3 significant digits, small ones in e-notation."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.2e}"
    return f"{value:.3g}"


def markdown(doc: dict) -> str:
    """A headline, the parts' table and the targets' table."""
    m = doc["machine"]
    passed = sum(p["status"] == "pass" for p in doc["parts"])
    where = ", ".join(str(m[k]) for k in ("gpu", "torch", "cuda") if m.get(k))
    dirty = " (with uncommitted changes)" if doc["dirty"] else ""
    lines = [
        f"GPU check of `{doc['commit']}`{dirty} on {doc['date']}" + (f" ({where})" if where else "") + ": "
        f"{passed} of {len(doc['parts'])} parts passed in {doc['seconds']:.0f} s (budget {doc['budget_s']:.0f} s).",
        "",
        "| part | status | seconds (budget) | tests passed/failed/skipped | measured |",
        "|---|---|---|---|---|",
    ]
    for p in doc["parts"]:
        t = p["tests"]
        tests = f"{t['passed']}/{t['failed']}/{t['skipped']}" if t else "-"
        measured = ", ".join(f"{k} {show(v)}" for k, v in p["numbers"].items())
        extra = "; ".join(x for x in [p["note"], *p["failures"]] if x)
        cell = "; ".join(x for x in [measured, extra] if x) or "-"
        lines.append(
            f"| {p['name']} | **{p['status']}** | {p['seconds']:.1f} ({p['budget_s']:.0f}) | {tests} | {_cell(cell)} |"
        )
    if doc["targets"]:
        lines += ["", "| target | part | measured | met |", "|---|---|---|---|"]
        for t in doc["targets"]:
            met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
            bound = f"{t['op']} {show(t['threshold'])}"
            lines.append(f"| {_cell(t['what'])} ({bound}) | {t['part']} | {show(t['value'])} | {met} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
