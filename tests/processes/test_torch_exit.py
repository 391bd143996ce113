"""A rank's process group is destroyed before the interpreter ends, when the script left it.

Without it a Gloo worker thread may free a finished collective's tensors during the interpreter's
finalization and abort the rank after its work ("terminate called without an active exception",
pytorch/pytorch#190489; a DDP job of the suite did so once). :func:`init_process_group` of
``bno_hvd.processes.torchenv`` (the torch engine's, and a script's under mpirun) registers
``finish_process_group`` at exit; a hook the script registered before it runs after it and sees
the group gone, on every rank. A script that raised keeps its group (a collective may wait for a peer).
"""

import pytest
from support.jobs import assert_ok, torchrun

pytestmark = pytest.mark.mpi

SCRIPT = """
import atexit, sys
import torch, torch.distributed as dist
from bno_hvd.processes.torchenv import init_process_group

atexit.register(lambda: print(f"rank {dist.get_rank() if dist.is_initialized() else '-'}: "
                              f"initialized at exit {dist.is_initialized()}", flush=True))
init_process_group("gloo")
tensor = torch.ones(3)
dist.all_reduce(tensor)
assert tensor.tolist() == [2.0, 2.0, 2.0]
if sys.argv[1] == "raise":
    raise RuntimeError("this rank failed")
"""


@pytest.mark.parametrize("end", ["return", "raise"])
def test_the_group_is_destroyed_at_exit_unless_the_script_raised(tmp_path, end):
    script = tmp_path / "leaves_its_group.py"
    script.write_text(SCRIPT)
    proc = torchrun(2, [str(script), end], timeout=120)
    if end == "return":
        assert_ok(proc)
        assert proc.stdout.count("initialized at exit False") == 2, proc.stdout + proc.stderr[-2000:]
    else:
        assert proc.returncode != 0
        assert "initialized at exit True" in proc.stdout, proc.stdout + proc.stderr[-2000:]
        assert "terminate called" not in proc.stderr, proc.stderr[-2000:]
