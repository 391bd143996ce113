"""bno-hvd keeps freed memory in each rank's heap (bno_hvd/processes/heap.py): an update's activations
are not faulted in again on every update, and a second run in the same process is not slower
than the first. A user's own malloc settings are kept."""

import re
import subprocess
import sys

import pytest
from support.jobs import ROOT

from bno_hvd.cli import launching
from bno_hvd.processes import mpienv
from bno_hvd.processes.heap import keep_freed_memory, user_chose

SCRIPT = "tests/support/mpi_scripts/heap_churn.py"
PAGES_PER_STEP = sum([3 << 20, 1 << 20, 6 << 20, 256 << 10, 2 << 20]) // 4096  # 3136


def faults(proc) -> list[float]:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [float(x) for x in re.findall(r": ([\d.]+) faults per step", proc.stdout)]


def churn(mode: str, env_changes=None) -> subprocess.CompletedProcess:
    env = mpienv.mpi_env(extra=env_changes)
    return subprocess.run([sys.executable, SCRIPT, mode], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)


@pytest.mark.slow
def test_glibc_defaults_fault_every_step_and_kept_memory_does_not():
    plain, kept = churn("plain"), churn("keep")
    assert "set=True" in kept.stdout
    # the control: without the setting this pattern faults most of its pages in every step
    assert faults(plain)[0] > PAGES_PER_STEP / 2
    assert faults(kept)[0] < 10


@pytest.mark.mpi
def test_every_rank_started_by_bno_hvd_keeps_freed_memory():
    proc = launching.mpirun(2, [sys.executable, SCRIPT, "world"], timeout=240, cwd=ROOT)
    per_rank = faults(proc)
    assert len(per_rank) == 2, proc.stdout
    assert all(f < 10 for f in per_rank), proc.stdout


@pytest.mark.parametrize(
    "environ",
    [
        {"MALLOC_TRIM_THRESHOLD_": "0"},
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"},
        {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},
    ],
)
def test_a_users_own_allocator_settings_are_kept(environ):
    assert user_chose(environ) and keep_freed_memory(environ) is False


@pytest.mark.slow
def test_a_users_trim_threshold_is_what_the_process_runs_with():
    # MALLOC_TRIM_THRESHOLD_=0: glibc gives back every free byte at the heap's top, and bno-hvd
    # leaves it so: the churn faults again although keep_freed_memory was called
    proc = churn("keep", {"MALLOC_TRIM_THRESHOLD_": "0"})
    assert "set=False" in proc.stdout
    assert faults(proc)[0] > PAGES_PER_STEP / 2


def test_unrelated_tunables_and_preloads_do_not_count_as_a_choice():
    assert not user_chose({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2", "LD_PRELOAD": "libfoo.so"})
