"""The test tiers: a test that starts a process must say so with a marker (setup.cfg lists them).

``launch/test --fast`` runs only unmarked tests, so an unmarked test that starts mpirun, a CLI
run or a DataLoader worker would make that tier slow without anyone noticing. While an unmarked
test (its fixtures included) runs, every way of starting a process fails it with a line naming
the markers, also when the code under test catches the error.
"""

import json
import multiprocessing.process
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bno_hvd.common.atomic import write_text_atomic

TIERS = ("mpi", "root", "slurm", "slow")
FAST = " and ".join(f"not {m}" for m in TIERS)  # launch/test --fast: -m "$FAST"


# Libraries that look the machine up once with a process (ctypes.util.find_library runs ldconfig when
# torch is first imported; matplotlib runs fc-list to build its font cache): not the test's doing.
LOOKUPS = ("ctypes.util", "matplotlib.font_manager")


class UnmarkedProcessError(RuntimeError):
    """Raised where an unmarked test starts a process."""


def _from_a_lookup() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__") in LOOKUPS:
            return True
        frame = frame.f_back
    return False


def _blocked(what, describe, original, errors):
    def start(*args, **kwargs):
        if _from_a_lookup():
            return original(*args, **kwargs)
        errors.append(
            f"this test started a process ({what}: {describe(*args, **kwargs)}) without a tier marker: "
            f"mark this test (or its module, pytestmark) with one of {', '.join(TIERS)} (setup.cfg)"
        )
        raise UnmarkedProcessError(errors[-1])

    return start


def _argv(_self, args, *rest, **kwargs):
    return " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)


# (owner, attribute, description of the call): everything that starts a process goes through one of
# these; subprocess.run/check_output/call and asyncio's subprocesses go through Popen._execute_child.
_STARTERS = [
    (subprocess.Popen, "_execute_child", _argv),
    (multiprocessing.process.BaseProcess, "start", lambda self: f"{type(self).__name__} {self.name}"),
    (os, "system", lambda cmd: cmd),
    (os, "posix_spawn", lambda path, *a, **k: path),
    (os, "posix_spawnp", lambda path, *a, **k: path),
    (os, "fork", lambda: "os.fork()"),
]


def is_marked(item) -> bool:
    return any(item.get_closest_marker(m) for m in TIERS)


# --- running in parallel (launch/test) ---------------------------------------------------------
# launch/test runs the suite in two groups at once: the tests that may not share the machine
# (ALONE: cgroups, namespaces, Slurm, or an outcome that depends on speed) one after another at
# normal priority, and beside them every other test on two pytest-xdist workers at idle priority
# (--dist loadfile: a test file is one unit of work, so its module-scoped jobs run once). Files start longest first,
# by the seconds DURATIONS holds (a file it does not know yet by its markers' guess), so that the
# many short ones fill the end and neither worker waits for the other's one long file.
ALONE = ("root", "slurm", "alone")
PARALLEL = " and ".join(f"not {m}" for m in ALONE)  # the shared group: -m "$PARALLEL"; the alone group: the rest
DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"  # {test file: seconds}, --record-durations
GUESS = {"mpi": 30.0, "root": 30.0, "slurm": 30.0, "slow": 10.0}  # seconds, for a file DURATIONS lacks


def _guess(item) -> float:
    return max((GUESS[m] for m in TIERS if item.get_closest_marker(m)), default=0.0)


def longest_first(files: dict[str, list], known: dict[str, float]) -> list[str]:
    """The test files in the order they should start: most seconds first (``known``, else the guess)."""
    seconds = {name: known.get(name, max(map(_guess, tests))) for name, tests in files.items()}
    return sorted(files, key=lambda name: -seconds[name])  # stable: equal files keep their order


def known_durations() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        action="store_true",
        help="write each test file's seconds of this run into tests/durations.json (launch/test orders by them)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    files = {}
    for item in items:  # the same order in every xdist worker: they must collect alike
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    items[:] = [item for name in longest_first(files, known_durations()) for item in files[name]]


_seconds: dict[str, float] = {}  # this session's seconds per test file (setup, call and teardown)


def pytest_runtest_logreport(report):
    name = report.nodeid.split("::")[0]
    if name.startswith("tests/"):  # not the small sessions test_layout.py runs with pytester
        _seconds[name] = _seconds.get(name, 0.0) + report.duration


def pytest_sessionfinish(session):
    """With --record-durations, on the controller (xdist's workers report their tests to it): this run's
    files replace their entries (each of launch/test's two groups writes its own, whole: the other
    group may be reading it)."""
    if not session.config.getoption("record_durations") or hasattr(session.config, "workerinput"):
        return
    known = {name: s for name, s in known_durations().items() if (DURATIONS.parents[1] / name).exists()}
    known.update({name: round(seconds, 1) for name, seconds in _seconds.items()})
    write_text_atomic(str(DURATIONS), json.dumps(dict(sorted(known.items())), indent=1) + "\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    return (yield from _guarded(item))


def _guarded(item):
    if is_marked(item):
        return (yield)
    errors = []
    saved = [
        (owner, name, describe, getattr(owner, name)) for owner, name, describe in _STARTERS if hasattr(owner, name)
    ]
    for owner, name, describe, original in saved:
        setattr(owner, name, _blocked(name, describe, original, errors))
    try:
        result = yield
    finally:
        for owner, name, _, original in saved:
            setattr(owner, name, original)
    if errors:  # the code under test may have caught it: fail the test anyway
        raise UnmarkedProcessError(errors[0])
    return result
