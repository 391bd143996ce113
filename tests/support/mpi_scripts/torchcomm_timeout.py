"""A TorchComm's collectives wait as long as the job's default group, not torch's 30 minutes.

Under torchrun with 2 ranks: ``init_process_group(timeout=3 s)``; a TorchComm and its ``Dup()``
are built (collective); rank 1 then calls nothing until rank 0 is done (a survivor's peer stuck elsewhere,
as under ``--elastic``) while rank 0 calls ``bcast`` on each. Rank 0 writes OUT_DIR/rank0.json:
what each call raised (its class) and after how many seconds."""

import datetime
import json
import os
import sys
import time

import torch.distributed as dist

from bno_hvd.processes.torchcomm import TorchComm

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
comm = TorchComm()
dup = comm.Dup()
rank = dist.get_rank()
done = os.path.join(sys.argv[1], "rank0.json")
if rank == 1:  # away until rank 0 is done (its exit would close the connections and fail rank 0's call)
    deadline = time.monotonic() + 600  # past the test's limit (120 s)
    while not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.1)
    os._exit(0)  # its groups still hold rank 0's half-done calls: no orderly teardown
got = {}
for name, c in (("comm", comm), ("dup", dup)):
    start = time.monotonic()
    try:
        c.bcast({"x": 1}, root=1)
        got[name] = ["returned", time.monotonic() - start]
    except RuntimeError as err:
        got[name] = [type(err).__name__, time.monotonic() - start]
with open(done + ".tmp", "w") as fh:
    json.dump(got, fh)
os.replace(done + ".tmp", done)
os._exit(0)
