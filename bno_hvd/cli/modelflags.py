"""The flags of how the model trains on uneven batches, added to the shared ones of :mod:`bno_hvd.cli.flags`."""

from __future__ import annotations

import click

from bno_hvd.training.config import TrainConfig

D = TrainConfig()

MODEL_OPTIONS = [
    (
        "exact-batchnorm",
        click.option(
            "--exact-batchnorm/--local-batchnorm",
            default=D.exact_batchnorm,
            show_default=True,
            help="A model's BatchNorm normalises by the global batch's statistics (one small allreduce per layer, "
            "forward and backward), so uneven ranks train exactly as one process; --local-batchnorm: by each "
            "rank's own batch, as plain Horovod does. Not under --max-batch/--max-tokens (micro-batches).",
        ),
    ),
]
