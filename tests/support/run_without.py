"""Run a port through ``tests/support/run_port.py`` with one of bno-hvd's mechanisms taken out, to
show that its exactness test would fail without it.

Usage (under torchrun): ``python tests/support/run_without.py MECHANISM OUT_DIR SCRIPT [script args]``

- ``weighting``: ``bno.accelerate.Accelerator`` is Accelerate's own (the balancer's loader passes
  through its ``prepare`` untouched, the model gets torch's DDP, which averages the ranks' gradients);
- ``exact``: ``bno.exact`` returns the model as it is (each rank's dropout draws its own masks,
  BatchNorm normalises by each rank's batch).
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
    elif mechanism == "exact":
        bno_hvd.exact = lambda model, balancer, **_: model  # module attributes win over bno_hvd.__getattr__
    else:
        raise SystemExit(f"run_without.py: unknown mechanism {mechanism!r}")


if __name__ == "__main__":
    take_out(sys.argv.pop(1))
    run_port.main()
