"""``bno-hvd train``: the training run (under horovodrun/mpirun), with every flag documented."""
from __future__ import annotations

import click

from ..allocation import STRATEGY_NAMES
from ..config import TrainConfig
from ..catalog import DATASET_NAMES, MODEL_NAMES
from ..emulation import parse_speeds

DEFAULTS = TrainConfig()


def train_options(fn=None, *, exclude=()):
    """Flags shared by train, bench and experiment (one place, one set of defaults)."""
    if fn is None:
        return lambda f: train_options(f, exclude=exclude)
    opts = [
        ("model", click.option("--model", type=click.Choice(MODEL_NAMES), default=DEFAULTS.model, show_default=True, help="Model to train.")),
        ("dataset", click.option("--dataset", type=click.Choice(DATASET_NAMES), default=DEFAULTS.dataset, show_default=True, help="fashion-mnist (Debian package), mnist (IDX files in --data-dir) or synthetic.")),
        ("data-dir", click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="Directory with IDX files (default for fashion-mnist: /usr/share/datasets/fashion-mnist).")),
        ("strategy", click.option("--strategy", type=click.Choice(STRATEGY_NAMES), default=DEFAULTS.strategy, show_default=True, help="Batch allocation strategy.")),
        ("base-batch-size", click.option("--base-batch-size", type=int, default=DEFAULTS.base_batch_size, show_default=True, help="Baseline batch size B per rank (the paper's B).")),
        ("batch-sizes", click.option("--batch-sizes", default=None, help="Per-rank batch sizes for --strategy fixed, e.g. 5,11,3,13.")),
        ("global-batch", click.option("--global-batch", type=int, default=None, help="Global batch kept fixed by balanced/lbbsp/proportional/paramhub/random (default N*B).")),
        ("updates", click.option("--updates", type=int, default=DEFAULTS.updates, show_default=True, help="Number of weight updates.")),
        ("lr", click.option("--lr", type=float, default=DEFAULTS.lr, show_default=True, help="Learning rate for the global batch N*B.")),
        ("lr-scaling", click.option("--lr-scaling", type=click.Choice(["linear", "none"]), default=DEFAULTS.lr_scaling, show_default=True, help="Scale the LR with the global batch when a strategy changes it (bno).")),
        ("optimizer", click.option("--optimizer", type=click.Choice(["sgd", "adam"]), default=DEFAULTS.optimizer, show_default=True, help="Optimizer (SGD uses --momentum).")),
        ("momentum", click.option("--momentum", type=float, default=DEFAULTS.momentum, show_default=True, help="SGD momentum.")),
        ("seed", click.option("--seed", type=int, default=DEFAULTS.seed, show_default=True, help="Seed of model init, sample order and random allocation.")),
        ("rebalance-every", click.option("--rebalance-every", type=int, default=DEFAULTS.rebalance_every, show_default=True, help="Rebalance every K updates.")),
        ("max-batch", click.option("--max-batch", type=int, default=None, help="Per-rank batch cap (memory limit in samples).")),
        ("emulate-speed", click.option("--emulate-speed", default=None, help="EMULATION: relative device speed per rank, e.g. 1,1,1,0.33.")),
        ("emulate-rate", click.option("--emulate-rate", type=float, default=DEFAULTS.emulate_rate, show_default=True, help="EMULATION: samples/s of a speed-1 rank.")),
        ("emulate-schedule", click.option("--emulate-schedule", type=click.Path(dir_okay=False), default=None, help="EMULATION: JSON file of speeds that change at given updates.")),
        ("latency-interval", click.option("--latency-interval", type=float, default=DEFAULTS.latency_interval, show_default=True, help="Seconds between latency probes (0: off).")),
        ("dtype", click.option("--dtype", type=click.Choice(["float32", "float64"]), default=DEFAULTS.dtype, show_default=True, help="Parameter/compute precision (float64 for exactness checks).")),
        ("threads", click.option("--threads", type=int, default=DEFAULTS.threads, show_default=True, help="torch threads per rank.")),
    ]
    for name, opt in reversed(opts):
        if name not in exclude:
            fn = opt(fn)
    return fn


def config_from_flags(**kw) -> TrainConfig:
    speeds = kw.pop("emulate_speed", None)
    kw["emulate_speed"] = tuple(parse_speeds(speeds)) if speeds else None
    from ..cli import parse_int_list
    kw["batch_sizes"] = parse_int_list(kw.get("batch_sizes"), "--batch-sizes")
    return TrainConfig(**kw)


@click.command()
@train_options
@click.option("--log-dir", type=click.Path(file_okay=False), default=None, help="Rank 0 writes run.json, updates.jsonl (one JSON line per update) and result.json here.")
@click.option("--save-model", type=click.Path(dir_okay=False), default=None, help="Rank 0 saves the model's state_dict here at the end.")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None, help="Directory for checkpoints.")
@click.option("--checkpoint-every", type=int, default=0, show_default=True, help="Checkpoint every K updates (0: never).")
@click.option("--keep-checkpoints", type=int, default=3, show_default=True, help="How many checkpoints to keep.")
@click.option("--resume", is_flag=True, help="Continue from the latest checkpoint in --checkpoint-dir.")
@click.option("--eval/--no-eval", default=True, show_default=True, help="Evaluate on the test split at the end.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on rank 0.")
@click.option("--dry-run", is_flag=True, help="Only validate the flags (and data) for --world-size ranks, then exit.")
@click.option("--world-size", type=int, default=None, help="With --dry-run: the number of ranks to validate for.")
@click.option("--inject-fault", default=None, hidden=True, help="Tests only: KIND:RANK:UPDATE[,...], see bno_hvd/faults.py.")
def train(dry_run, world_size, **kw):
    """Train under horovodrun/mpirun; rank 0 logs and prints test accuracy."""
    cfg = config_from_flags(**kw)
    if dry_run:
        from ..errors import UsageError
        from ..train import prepare
        if world_size is not None and world_size < 1:
            raise UsageError(f"--world-size must be a positive integer, got {world_size}")
        cfg.check_world(world_size or 1)
        prepare(cfg, 0, world_size or 1)
        click.echo("ok")
        return
    from ..train import TrainingError, init_horovod, run_training
    hvd, control_comm, monitor_comm = init_horovod()
    try:
        run_training(cfg, hvd, control_comm, monitor_comm)
    except TrainingError as err:
        from ..cli import fail
        fail(str(err), 1)


COMMANDS = [train]
