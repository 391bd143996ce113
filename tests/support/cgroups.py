"""Real cgroups in tests: skip where none can be written, and see that a run leaves none behind."""

import os
import time

import pytest

from bno_hvd.common.errors import UsageError
from bno_hvd.lab.cpuquota import find_place


def cgroup_reason():
    """Why real quota runs cannot happen here, or None."""
    try:
        find_place()
    except (UsageError, OSError) as err:
        return str(err)
    return None


def needs_cgroups(test):
    """A test that makes real cgroups: marked ``root`` (setup.cfg), skipped where none can be written."""
    reason = cgroup_reason()
    return pytest.mark.root(pytest.mark.skipif(reason is not None, reason=f"no writable cgroups: {reason}")(test))


def our_cgroups(suite=False):
    """bno-hvd's cgroups now, without the suite profiles' ``bno-hvd-suite-*`` unless ``suite``: only
    ``bench --suite`` makes those, and a parallel run may be running it beside the caller."""
    place = find_place()
    names = sorted(n for n in os.listdir(place.parent) if n.startswith("bno-hvd-"))
    return [n for n in names if suite or not n.startswith("bno-hvd-suite-")]


def wait_until_gone(before, seconds=60, suite=False):
    deadline = time.time() + seconds
    while time.time() < deadline and our_cgroups(suite) != before:
        time.sleep(0.2)
    return our_cgroups(suite)
