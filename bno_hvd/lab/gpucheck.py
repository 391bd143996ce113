"""The GPU check: one run on a lent GPU machine that exercises every GPU path (``launch/gpu-check OUT``).

A GPU machine is lent now and then, for minutes, with no network and no registry: its python has
torch with CUDA (no Horovod: the torch engine runs) and only the repository's working tree
travels. So the check needs no build there: it installs the project into that python without
dependencies, then runs its parts one after another, each a process with a time budget of its
own. A part that overruns is stopped (SIGINT to its process group, so pytest's fixtures clean up;
SIGKILL to whatever is left after a grace) and reported ``timeout``; the parts after it still
run, each within what is left of the whole budget (:data:`TOTAL_BUDGET_S`). Every part but the
first two is a pytest selection of the suite's GPU tests (they skip without CUDA); what they
measure comes back through ``record_property`` in pytest's JUnit XML. The report goes to
``OUT/report.json`` and ``OUT/report.md`` (:mod:`bno_hvd.lab.gpureport`), each part's output to
``OUT/PART/log.txt``.

Usage::

    python -m bno_hvd.lab.gpucheck OUT [--only PART,...] [--total SECONDS] [--commit SHA]
    python -m bno_hvd.lab.gpucheck OUT --dry-run      # what it would run, with each budget
    python -m bno_hvd.lab.gpucheck --pack             # here, before a run: wheels of the pure-Python
                                                      # dependencies the GPU machine may lack
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time

from bno_hvd.common.atomic import write_json_atomic, write_text_atomic
from bno_hvd.common.errors import UsageError
from bno_hvd.lab.gpuparts import TARGETS, TOTAL_BUDGET_S, Part, check_parts
from bno_hvd.lab.gpureport import PartResult, junit_outcomes, markdown, report_dict, validate_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRACE_S = 10.0  # after SIGINT, before SIGKILL
MIN_START_S = 10.0  # a part is not started with less time than this left
WHEELS = os.path.join("build", "gpu-check-wheels")  # carried to the GPU machine (an ignored path)
PURE_PYTHON_DEPS = ("click", "tqdm")  # what the torch engine imports that a torch install may lack


def status_of(returncode: int | None, timed_out: bool, counts: dict) -> str:
    """A part's status from how it ended and pytest's counts (empty for a part that is not pytest)."""
    if timed_out:
        return "timeout"
    if returncode == 5 or (returncode == 0 and counts and counts["passed"] == 0 and counts["skipped"] > 0):
        return "skip"  # pytest: no test selected, or every test skipped
    return "pass" if returncode == 0 else "fail"


def stop_tree(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGINT to the part's process group (pytest then runs its fixtures' clean-up), then SIGKILL to
    every process left of it: the group and any descendant that started a session of its own."""
    import psutil

    try:
        tree = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        tree = [proc.pid]
    _signal_group(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_part(part: Part, folder: str, budget_s: float, *, cwd: str, env: dict, grace_s: float = GRACE_S) -> PartResult:
    """Run one part in a session of its own, stopped after ``budget_s``; what it did, read back."""
    os.makedirs(folder, exist_ok=True)
    argv = [a.replace("{dir}", folder) for a in part.argv]
    start, timed_out = time.monotonic(), False
    with open(os.path.join(folder, "log.txt"), "w") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        proc = subprocess.Popen(
            argv, cwd=cwd, env={**env, "GPU_CHECK_PART_DIR": folder}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_tree(proc, grace_s)
    seconds = time.monotonic() - start
    counts, failures, numbers = {}, [], {}
    junit = os.path.join(folder, "junit.xml")
    if os.path.exists(junit):
        try:
            counts, failures, numbers = junit_outcomes(open(junit).read())
        except Exception as err:  # a part killed while writing it: say so, keep the rest
            failures = [f"junit.xml unreadable: {err}"]
    numbers.update(_read_numbers(folder))
    returncode = None if timed_out else proc.returncode
    note = f"stopped after its budget of {budget_s:.0f} s" if timed_out else ""
    log_path = os.path.join(os.path.basename(folder), "log.txt")
    return PartResult(
        part.name, part.what, status_of(returncode, timed_out, counts), seconds, budget_s, returncode,
        numbers, counts, failures, log_path, note,
    )  # fmt: skip


def _read_numbers(folder: str) -> dict:
    try:
        with open(os.path.join(folder, "numbers.json")) as fh:
            return dict(json.load(fh))
    except (OSError, ValueError, TypeError):
        return {}


def run_check(
    parts, out: str, *, total_s: float, cwd: str = ROOT, env=None, grace_s=GRACE_S, min_start_s=MIN_START_S, echo=print
):
    """Every part in turn within ``total_s`` seconds in all; their results (skipped where less than
    ``min_start_s`` was left)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = cwd + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    deadline, results = time.monotonic() + total_s, []
    for part in parts:
        left = deadline - time.monotonic()
        if left < min_start_s:
            results.append(PartResult(part.name, part.what, "skip", 0.0, part.budget_s, note="no time left"))
        else:
            echo(f"gpu-check: {part.name} (budget {min(part.budget_s, left):.0f} s)")
            folder = os.path.join(out, part.name)
            results.append(run_part(part, folder, min(part.budget_s, left), cwd=cwd, env=env, grace_s=grace_s))
            _stop_mps()  # a part stopped by its budget may have left an MPS daemon
        r = results[-1]
        echo(f"gpu-check: {part.name}: {r.status} in {r.seconds:.1f} s" + (f" ({r.note})" if r.note else ""))
    return results


def _stop_mps() -> None:
    from bno_hvd.lab.gpushares import MPS_FOLDER, stop_mps

    stop_mps(MPS_FOLDER)


def git_commit(root: str = ROOT) -> tuple[str, bool]:
    """``(short commit, dirty)`` of the checkout; ``("unknown", False)`` where there is no git (the
    GPU machine gets the working tree only: pass ``--commit``)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True)
    except OSError:
        return "unknown", False
    if sha.returncode != 0:
        return "unknown", False
    return sha.stdout.strip(), bool(dirty.stdout.strip())


def write_report(out: str, results, *, commit: str, dirty: bool, total_s: float, seconds: float) -> dict:
    probe = next((r.numbers for r in results if r.name == "environment"), {})
    machine = {k: probe[k] for k in ("gpu", "gpu_memory_gib", "driver", "torch", "cuda", "python") if k in probe}
    date = datetime.date.today().isoformat()
    doc = report_dict(
        results, TARGETS, date=date, commit=commit, dirty=dirty, machine=machine, budget_s=total_s, seconds=seconds
    )
    validate_report(doc)
    write_json_atomic(os.path.join(out, "report.json"), doc)
    write_text_atomic(os.path.join(out, "report.md"), markdown(doc))
    return doc


def require_gpu() -> None:
    """Raises :class:`UsageError` (one line) where this python sees no CUDA device."""
    try:
        import torch
    except ImportError:
        raise UsageError(f"gpu-check: {sys.executable} has no torch; run it with the python that has torch") from None
    if not torch.cuda.is_available():
        raise UsageError(
            "gpu-check: no CUDA device here (torch.cuda.is_available() is False); run it on a GPU machine, "
            "or see what it would run with --dry-run"
        )


def dry_run(parts, total_s: float) -> str:
    lines = [f"gpu-check would run {len(parts)} parts within {total_s:.0f} s in all (each at most its budget):"]
    for p in parts:
        lines.append(f"  {p.name:<16} {p.budget_s:>4.0f} s  {p.what}")
        lines.append(f"  {'':<16}         $ {' '.join(p.argv)}")
    lines.append(f"  budgets sum to {sum(p.budget_s for p in parts):.0f} s")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints its usage too)
        raise UsageError(f"gpu-check: {message}; see --help")


def parse_args(argv):
    parser = _Parser(prog="launch/gpu-check", description="Run the GPU check (see bno_hvd/lab/gpucheck.py).")
    parser.add_argument("out", nargs="?", help="folder for report.json, report.md and each part's log")
    parser.add_argument("--dry-run", action="store_true", help="list the parts, their budgets and commands; run none")
    parser.add_argument("--only", help="comma-separated part names (default: all)")
    parser.add_argument("--total", type=float, default=TOTAL_BUDGET_S, help="seconds for all parts together")
    parser.add_argument("--commit", help="the commit the tree is at (the GPU machine has no git)")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--install", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--pack", action="store_true", help=f"download {', '.join(PURE_PYTHON_DEPS)} wheels to {WHEELS}"
    )
    args = parser.parse_args(argv)
    if not (args.out or args.probe or args.install or args.pack):
        raise UsageError("gpu-check: give OUT, the folder for the report (e.g. launch/gpu-check gpu-report)")
    if not 0 < args.total <= 3600:
        raise UsageError(f"gpu-check: --total {args.total:g} must be between 0 and 3600 seconds")
    return args


def select(parts, only: str | None):
    if not only:
        return parts
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in {p.name for p in parts}]
    if unknown:
        raise UsageError(
            f"gpu-check: --only {','.join(unknown)}: no such part; the parts: {', '.join(p.name for p in parts)}"
        )
    return [p for p in parts if p.name in names]


def main(argv=None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        if args.probe or args.install or args.pack:
            from bno_hvd.lab import gpuprobe

            return gpuprobe.main(args, ROOT, WHEELS, PURE_PYTHON_DEPS)
        parts = select(check_parts(), args.only)
        if args.dry_run:
            print(dry_run(parts, args.total))
            return 0
        require_gpu()
    except UsageError as err:
        print(str(err), file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    commit, dirty = (args.commit, False) if args.commit else git_commit()
    start = time.monotonic()
    results = run_check(parts, os.path.abspath(args.out), total_s=args.total)
    doc = write_report(
        args.out, results, commit=commit, dirty=dirty, total_s=args.total, seconds=time.monotonic() - start
    )
    print(markdown(doc))
    print(f"gpu-check: wrote {args.out}/report.json and report.md")
    return 0 if all(p["status"] in ("pass", "skip") for p in doc["parts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
