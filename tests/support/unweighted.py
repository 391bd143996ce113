"""Run a script through tests/support/run_port.py with the DDP drop-in's weighting switched off.

Usage (under torchrun): ``python tests/support/unweighted.py OUT_DIR SCRIPT [script args]``

The drop-in's communication hook (``bno_hvd.library.ddp.weighted_allreduce_hook``) is replaced by
what plain DDP does, the mean over the ranks (divide by the world size, then sum), whatever each
rank's share of the global batch: the control that shows the weighting is what makes uneven
batches exact (tests/library/test_lightning.py).
"""

import os
import sys

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from support.run_port import main  # noqa: E402

import bno_hvd.library.ddp as ddp  # noqa: E402


def mean_over_ranks(state, bucket):
    """Plain DDP's reduction: each rank's gradient counts 1/N, whatever its batch."""
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(state.update_group()))
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=state.update_group(), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


if __name__ == "__main__":
    ddp.weighted_allreduce_hook = mean_over_ranks
    main()
