"""``bno-hvd train`` (its shared flags are in :mod:`bno_hvd.cli.flags`)."""

from __future__ import annotations

import click

from bno_hvd.cli.flags import D, config_from_flags, train_options
from bno_hvd.common.errors import UsageError


@click.command()
@train_options
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False),
    default=D.log_dir,
    help="Rank 0 writes run.json, updates.jsonl (one JSON line per update), result.json and ranks.json here.",
)
@click.option(
    "--save-model",
    type=click.Path(dir_okay=False),
    default=D.save_model,
    help="Rank 0 saves the model's state_dict here at the end.",
)
@click.option(
    "--checkpoint-dir", type=click.Path(file_okay=False), default=D.checkpoint_dir, help="Directory for checkpoints."
)
@click.option(
    "--checkpoint-every",
    type=int,
    default=D.checkpoint_every,
    show_default=True,
    help="Checkpoint every K updates (0: never).",
)
@click.option(
    "--keep-checkpoints", type=int, default=D.keep_checkpoints, show_default=True, help="How many checkpoints to keep."
)
@click.option(
    "--resume", is_flag=True, default=D.resume, help="Continue from the latest checkpoint in --checkpoint-dir."
)
@click.option("--eval/--no-eval", default=D.eval, show_default=True, help="Evaluate on the test split at the end.")
@click.option(
    "--eval-every",
    type=int,
    default=D.eval_every,
    show_default=True,
    help="Also evaluate every K updates (0: only at the end).",
)
@click.option("--progress/--no-progress", default=D.progress, show_default=True, help="Progress bar on rank 0.")
@click.option("--dry-run", is_flag=True, help="Only validate the flags (and data) for --world-size ranks, then exit.")
@click.option("--world-size", type=int, default=None, help="With --dry-run: the number of ranks to validate for.")
@click.option(
    "--elastic",
    is_flag=True,
    default=D.elastic,
    help="Ranks may leave and join (torch engine, fixed --global-batch); start the job with bno-hvd elastic.",
)
@click.option(
    "--elastic-timeout",
    type=float,
    default=D.elastic_timeout,
    show_default=True,
    help="With --elastic: seconds a collective or a re-formation waits before a rank counts as gone.",
)
@click.option(
    "--inject-fault",
    default=D.inject_fault,
    hidden=True,
    help="Tests only: KIND:RANK:UPDATE[,...], see bno_hvd/lab/faults.py.",
)
def train(dry_run, world_size, **kw):
    """Train under horovodrun/mpirun; rank 0 logs and prints test accuracy."""
    cfg = config_from_flags(**kw)
    if dry_run:
        from bno_hvd.lab.plugin import lab_plugin
        from bno_hvd.training.components import prepare

        if world_size is not None and world_size < 1:
            raise UsageError(f"--world-size must be a positive integer, got {world_size}")
        prepare(cfg, 0, world_size or 1, plugin=lab_plugin)
        click.echo("ok")
        return
    from bno_hvd.lab.plugin import lab_plugin

    if cfg.elastic:
        elastic_worker(cfg, lab_plugin)
        return
    from bno_hvd.processes.world import init_world
    from bno_hvd.training.loop import run_training

    run_training(cfg, init_world(**cfg.world_options()), plugin=lab_plugin)


def elastic_worker(cfg, plugin) -> None:
    """A worker of ``bno-hvd elastic``: its store and id come from the agent's environment."""
    import os

    from bno_hvd.processes.membership import ID_ENV, STORE_ENV, Membership
    from bno_hvd.training.elastic import run_elastic

    if not os.environ.get(STORE_ENV) or not os.environ.get(ID_ENV, "").isdigit():
        raise UsageError("--elastic workers are started by bno-hvd elastic: bno-hvd elastic -n 4 -- train ...")
    run_elastic(cfg, Membership(os.environ[STORE_ENV], int(os.environ[ID_ENV])), plugin=plugin)


COMMANDS = [train]
