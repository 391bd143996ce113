"""The test tiers: a test that starts a process must say so with a marker (setup.cfg lists them).

``launch/test --fast`` runs only unmarked tests, so an unmarked test that starts mpirun, a CLI
run or a DataLoader worker would make that tier slow without anyone noticing. While an unmarked
test (its fixtures included) runs, every way of starting a process fails it with a line naming
the markers, also when the code under test catches the error.
"""

import multiprocessing.process
import os
import subprocess
import sys

import pytest

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
# launch/test runs the suite in two phases: first every test that may share the machine, on two
# pytest-xdist workers (--dist loadfile: a test file is one unit of work, so its module-scoped
# jobs run once), then the tests that may not (ALONE: cgroups, namespaces, Slurm, or an outcome
# that depends on speed) one after another with nothing beside them. Files start longest first
# (mpi, root, slurm, slow, the rest), so that the many short ones fill the end.
ALONE = ("root", "slurm", "alone")
PARALLEL = " and ".join(f"not {m}" for m in ALONE)  # phase 1: -m "$PARALLEL"; phase 2: the rest


def _rank(item) -> int:
    return next((i for i, m in enumerate(TIERS) if item.get_closest_marker(m)), len(TIERS))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    files = {}
    for item in items:  # the same order in every xdist worker: they must collect alike
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = sorted(files.values(), key=lambda tests: min(_rank(i) for i in tests))
    items[:] = [item for tests in order for item in tests]


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
