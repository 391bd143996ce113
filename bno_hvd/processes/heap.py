"""Keep freed memory in the process's heap, so that a training step does not fault its pages in again.

Every update allocates its activations and gradients (megabytes) and frees them at the end. By
default glibc's malloc gives the top of the heap back to the kernel as soon as more than its trim
threshold is free there, and serves large blocks from fresh ``mmap`` regions; both thresholds move
with the history of the process. The next update then takes a page fault for every 4 KiB it
touches again. Whether that happens depends on how earlier allocations fell, so one rank may run
without it and another pay for it on every update, and a process's second training run (``bench``
runs its strategies one after another) is slower than its first.

Measured here (4 ranks, CNN, 32 samples each, ``bench --strategies equal,fixed --batch-sizes
32,32,32,32``, the same allocation twice): with glibc's defaults the first run took ~25,000 page
faults per rank and the second 93,000-420,000 on one to three ranks, and the second ran at
0.82-0.97x the first (five runs). With the thresholds below the second run took ~12,600 per rank
and ran at 0.97-0.99x.

:func:`keep_freed_memory` sets a fixed trim threshold of 512 MiB and a fixed mmap threshold of
32 MiB (glibc's largest) with ``mallopt``. A process's resident memory then stays at its peak
instead of shrinking between updates. Set ``MALLOC_TRIM_THRESHOLD_`` or ``MALLOC_MMAP_THRESHOLD_``
(or ``glibc.malloc`` tunables in ``GLIBC_TUNABLES``) to keep your own; with another allocator
(``LD_PRELOAD`` of jemalloc or tcmalloc) or without glibc nothing is changed.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
TRIM_THRESHOLD = 512 << 20
MMAP_THRESHOLD = 32 << 20  # glibc refuses more than HEAP_MAX_SIZE / 2 (32 MiB on 64-bit)
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def user_chose(environ=os.environ) -> bool:
    """Did the user set malloc's thresholds or bring another allocator?"""
    if any(name in environ for name in USER_SETTINGS):
        return True
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return True
    preload = environ.get("LD_PRELOAD", "")
    return any(lib in preload for lib in ("jemalloc", "tcmalloc", "mimalloc"))


def keep_freed_memory(environ=os.environ) -> bool:
    """Fix glibc malloc's trim and mmap thresholds in this process (and the processes it forks,
    such as DataLoader workers). Returns whether they were set."""
    if user_chose(environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
