"""Page faults of an update-like allocation pattern: a forward pass's activations (megabytes of
mixed sizes) allocated, touched and freed in reverse, 100 times. Prints faults per step.

``python heap_churn.py plain|keep|world``: glibc's defaults; after
:func:`bno_hvd.processes.heap.keep_freed_memory`; or in a rank started by :func:`bno_hvd.processes.world.init_world`.
"""

import ctypes
import resource
import sys

PATTERN = [3 << 20, 1 << 20, 6 << 20, 256 << 10, 2 << 20]
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]


def step():
    blocks = []
    for size in PATTERN:
        block = libc.malloc(size)
        libc.memset(block, 1, size)  # touch every page, as a tensor's first write does
        blocks.append(block)
    for block in reversed(blocks):
        libc.free(block)


def faults_per_step(steps=100) -> float:
    for _ in range(3):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps


if __name__ == "__main__":
    mode, label = sys.argv[1], "process"
    if mode == "keep":
        from bno_hvd.processes.heap import keep_freed_memory

        print(f"set={keep_freed_memory()}")
    elif mode == "world":
        from bno_hvd.processes.world import init_world

        label = f"rank {init_world().rank}"
    print(f"{label}: {faults_per_step():.1f} faults per step", flush=True)
