"""The checks of ``--elastic`` (:mod:`bno_hvd.training.elastic`): what it refuses, each in one line
(a table of (fails?, message) as :data:`bno_hvd.training.config.PAIR_RULES`)."""

from __future__ import annotations

from bno_hvd.allocation import split_spec

_HOROVOD_ELASTIC = (
    "--elastic needs --engine torch: the Horovod engine's ranks and control plane are one MPI world, which "
    "cannot lose or gain a rank while it runs (horovodrun's elastic mode needs its Gloo controller instead)"
)

# --elastic: what it refuses, each in one line
ELASTIC_RULES: tuple = (
    (lambda c: c.elastic and c.engine != "torch", lambda c: _HOROVOD_ELASTIC),
    (
        lambda c: c.elastic and c.global_batch is None,
        lambda c: "--elastic needs --global-batch G: the global batch must not depend on how many ranks there are",
    ),
    (
        lambda c: c.elastic and split_spec(c.strategy)[0] in ("fixed", "bno"),
        lambda c: f"--elastic needs a strategy that splits a fixed global batch over any ranks, not {c.strategy}",
    ),
    (
        lambda c: c.elastic and (c.dataset == "text" or c.amp or c.num_workers > 0),
        lambda c: "--elastic trains images in the training process: drop --amp, --num-workers and --dataset text",
    ),
    (
        lambda c: not 1 <= c.elastic_timeout <= 3600,
        lambda c: f"--elastic-timeout must be between 1 and 3600 s, got {c.elastic_timeout:g}",
    ),
)
