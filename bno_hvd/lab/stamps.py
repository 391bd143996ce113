"""Time a user's training script from outside: when each update ended, on every rank.

``python -m bno_hvd.lab.stamps OUT SCRIPT [ARGS]`` runs ``SCRIPT`` unchanged (as ``__main__``) with
global optimizer step hooks (torch's public ``register_optimizer_step_pre_hook`` / ``_post_hook``)
that note the wall time (``time.perf_counter``) and the process's CPU time (``time.process_time``:
every thread of the rank, Gloo's and the loader's too; what a CFS quota rations) at the end of
every outermost ``optimizer.step()`` (Horovod's ``DistributedOptimizer.step`` calls the wrapped
optimizer's, whose hooks run too). When the script is done the rank writes
``OUT/stamps-RANK.json`` (``{"rank", "steps": [seconds, ...], "cpu": [seconds, ...]}``) and then
``OUT/done-RANK``: what follows is the process's exit. A DDP script that calls
``destroy_process_group()`` while its model lives can hang there in Gloo's teardown
(pytorch/pytorch#56297): the hook keeps the default group from the first step on, so that its last
reference is this module's, dropped from Python after the done file (as tests/support/run_port.py
does); a driver that sees rank 0's done file may still bound the job.

The plain script and its port are timed alike: nothing of bno-hvd is imported before the script
does so itself. Used by ``benchmarks/dropin_real.py``.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m bno_hvd.lab.stamps OUT SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    out, script = argv[0], argv[1]
    import torch.distributed as dist
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    steps: list[float] = []
    cpu: list[float] = []  # the process's CPU seconds at the same moments: what a CFS quota rations
    kept = []  # the default process group, once a step ran (see the module doc)
    depth = [0]  # steps in progress: Horovod's optimizer.step() runs the inner optimizer's step (hooked too)

    def enter(*_):
        depth[0] += 1

    def stamp(*_):
        depth[0] -= 1
        if depth[0] == 0:  # the outermost step ended: one update
            steps.append(time.perf_counter())
            cpu.append(time.process_time())
        if not kept and dist.is_available() and dist.is_initialized():
            kept.append(dist.group.WORLD)

    handles = [register_optimizer_step_pre_hook(enter), register_optimizer_step_post_hook(stamp)]
    sys.argv = [script, *argv[2:]]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as end:  # a script (or a click command: bno-hvd's) that ends by sys.exit(0)
        if end.code not in (None, 0):
            raise
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    with open(os.path.join(out, f"stamps-{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "steps": steps, "cpu": cpu}, fh)
    open(os.path.join(out, f"done-{rank}"), "w").close()
    for handle in handles:
        handle.remove()
    from bno_hvd.processes.torchenv import finish_process_group

    finish_process_group()  # a script that left its group: destroyed here, not in the interpreter's end
    kept.clear()  # (after the models, which finish_process_group collects first)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
