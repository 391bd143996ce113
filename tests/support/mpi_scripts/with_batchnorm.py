"""Run a DDP example (``examples/ddp_mnist.py``, ``examples/ddp_elastic.py``) with BatchNorm in its
``Net``: a ``BatchNorm2d`` after each convolution. ``--exact`` puts ``bno.exact`` (dropout and
BatchNorm) where the example calls ``bno.exact_dropout``; without it the model keeps torch's own
BatchNorm (the one-process reference).

Usage: ``python tests/support/mpi_scripts/with_batchnorm.py [--exact] EXAMPLE [its args]`` (under
``tests/support/run_port.py``, which runs it as the script).
"""

import importlib.util
import sys

import torch.nn as nn

import bno_hvd as bno


def with_batchnorm(base):
    class Net(base):  # the name the port harness notes forwards of
        def __init__(self):
            super().__init__()
            conv1, pool1, relu1, conv2, *rest = self.features
            self.features = nn.Sequential(conv1, nn.BatchNorm2d(10), pool1, relu1, conv2, nn.BatchNorm2d(20), *rest)

    return Net


def main():
    exact = sys.argv[1] == "--exact"
    path, *args = sys.argv[2:] if exact else sys.argv[1:]
    spec = importlib.util.spec_from_file_location("example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.Net = with_batchnorm(example.Net)
    if exact:
        example.bno = type(sys)("bno_exact_batchnorm")  # the example's `bno`, with exact_dropout -> exact
        example.bno.__dict__.update(vars(bno), exact_dropout=bno.exact)
    sys.argv = [path, *args]
    example.main()


if __name__ == "__main__":
    main()
