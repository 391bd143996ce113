"""Every rank prints a line, the same warning, a Python warning, its own error and a shared error
(the console must show rank 0's line and each distinct warning/error once)."""

import sys
import warnings

from bno_hvd.processes.world import launched_rank

rank = launched_rank()
print(f"line from rank {rank}", flush=True)
print("bno-hvd: warning:", "the same on every rank", file=sys.stderr, flush=True)  # several pieces
warnings.warn("every rank warns", stacklevel=1)
print(f"bno-hvd: error: rank {rank}: only mine", file=sys.stderr, flush=True)
print("bno-hvd: error: the same on every rank", file=sys.stderr, flush=True)
