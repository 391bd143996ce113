"""Run a port through ``tests/support/run_port.py`` with one of bno-hvd's mechanisms taken out, to
show that its exactness test would fail without it.

Usage (under torchrun): ``python tests/support/run_without.py MECHANISM OUT_DIR SCRIPT [script args]``

- ``weighting``: ``bno.accelerate.Accelerator`` is Accelerate's own (the balancer's loader passes
  through its ``prepare`` untouched, the model gets torch's DDP, which averages the ranks' gradients);
- ``exact``: ``bno.exact`` returns the model as it is (each rank's dropout draws its own masks,
  BatchNorm normalises by each rank's batch);
- ``trainer-count``: ``bno.hf.BalancedTrainer`` takes transformers' own ``num_items_in_batch``
  (every label that is not -100 for a GPT-2: one more per sequence than its loss predicts) and
  its loss is each process's mean, weighted by the hook.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import run_port  # noqa: E402 - after its folder is on the path


def take_out(mechanism: str) -> None:
    import accelerate

    import bno_hvd
    from bno_hvd.library.frameworks import accelerate as adapter

    if mechanism == "weighting":
        adapter.Accelerator = accelerate.Accelerator
    elif mechanism == "trainer-count":
        import transformers

        from bno_hvd.library.frameworks.trainer import BalancedTrainer

        BalancedTrainer.get_batch_samples = transformers.Trainer.get_batch_samples
        BalancedTrainer.training_step = transformers.Trainer.training_step
    elif mechanism == "exact":
        bno_hvd.exact = lambda model, balancer, **_: model  # module attributes win over bno_hvd.__getattr__
    else:
        raise SystemExit(f"run_without.py: unknown mechanism {mechanism!r}")


if __name__ == "__main__":
    take_out(sys.argv.pop(1))
    run_port.main()
