"""The flags train, bench and experiment share (defaults from TrainConfig), made a validated TrainConfig."""

from __future__ import annotations

import click

from bno_hvd.allocation import STRATEGY_NAMES
from bno_hvd.cli.modelflags import MODEL_OPTIONS
from bno_hvd.cli.textflags import TEXT_OPTIONS, text_values
from bno_hvd.common.parsing import CAP, parse_int_list
from bno_hvd.data.catalog import DATASET_NAMES, MODEL_NAMES, TEXT_DATASET_NAMES, TEXT_MODEL_NAMES
from bno_hvd.lab.cpuquota import parse_quotas
from bno_hvd.lab.emulation import parse_speeds
from bno_hvd.lab.plugin import check_lab_config
from bno_hvd.training.config import TrainConfig

D = TrainConfig()  # the defaults, shown by every flag


def train_options(fn=None, *, exclude=()):
    """Flags shared by train, bench and experiment (one place; defaults from TrainConfig)."""
    if fn is None:
        return lambda f: train_options(f, exclude=exclude)
    opts = [
        (
            "model",
            click.option(
                "--model",
                default=D.model,
                show_default=True,
                help=f"Model: {', '.join(MODEL_NAMES + TEXT_MODEL_NAMES)}, any torchvision classification model "
                "(e.g. resnet18), or package.module:function returning an nn.Module.",
            ),
        ),
        (
            "num-classes",
            click.option(
                "--num-classes",
                type=int,
                default=D.num_classes,
                help="Classes of the model's head (default: the dataset's).",
            ),
        ),
        (
            "dataset",
            click.option(
                "--dataset",
                type=click.Choice(DATASET_NAMES + TEXT_DATASET_NAMES),
                default=D.dataset,
                show_default=True,
                help="fashion-mnist (Debian package), mnist (IDX files in --data-dir), synthetic, imagefolder "
                "(--data-dir with train/ and val/ of class folders), or text (Debian's fortunes, or --data-dir "
                "of .txt/.jsonl files).",
            ),
        ),
        (
            "data-dir",
            click.option(
                "--data-dir",
                type=click.Path(file_okay=False),
                default=D.data_dir,
                help="Dataset directory (default for fashion-mnist: /usr/share/datasets/fashion-mnist).",
            ),
        ),
        (
            "image-size",
            click.option(
                "--image-size",
                type=int,
                default=D.image_size,
                show_default=True,
                help="imagefolder: side of the square training crops and test images.",
            ),
        ),
        (
            "strategy",
            click.option(
                "--strategy",
                default=D.strategy,
                show_default=True,
                help=f"Batch allocation strategy: {', '.join(STRATEGY_NAMES)}; options after colons, "
                "e.g. balanced:deadband=0.1 (docs/heterogeneity.md: strategy options).",
            ),
        ),
        (
            "base-batch-size",
            click.option(
                "--base-batch-size",
                type=int,
                default=D.base_batch_size,
                show_default=True,
                help="Baseline batch size B per rank (the paper's B).",
            ),
        ),
        (
            "batch-sizes",
            click.option(
                "--batch-sizes", default=None, help="Per-rank batch sizes for --strategy fixed, e.g. 5,11,3,13."
            ),
        ),
        (
            "global-batch",
            click.option(
                "--global-batch",
                type=int,
                default=D.global_batch,
                help="Global batch kept fixed by balanced/lbbsp/proportional/paramhub/random (default N*B).",
            ),
        ),
        (
            "updates",
            click.option("--updates", type=int, default=D.updates, show_default=True, help="Number of weight updates."),
        ),
        (
            "lr",
            click.option(
                "--lr", type=float, default=D.lr, show_default=True, help="Learning rate for the global batch N*B."
            ),
        ),
        (
            "lr-scaling",
            click.option(
                "--lr-scaling",
                type=click.Choice(["linear", "none"]),
                default=D.lr_scaling,
                show_default=True,
                help="Scale the LR with the global batch when a strategy changes it (bno).",
            ),
        ),
        (
            "optimizer",
            click.option(
                "--optimizer",
                type=click.Choice(["sgd", "adam"]),
                default=D.optimizer,
                show_default=True,
                help="Optimizer (SGD uses --momentum).",
            ),
        ),
        (
            "momentum",
            click.option("--momentum", type=float, default=D.momentum, show_default=True, help="SGD momentum."),
        ),
        (
            "seed",
            click.option(
                "--seed",
                type=int,
                default=D.seed,
                show_default=True,
                help="Seed of model init, sample order, augmentation and random allocation.",
            ),
        ),
        (
            "rebalance-every",
            click.option(
                "--rebalance-every",
                type=int,
                default=D.rebalance_every,
                show_default=True,
                help="Rebalance every K updates.",
            ),
        ),
        (
            "max-batch",
            click.option(
                "--max-batch",
                default=None,
                help="Memory cap in samples per forward/backward pass: one for all ranks, one per rank "
                "(e.g. 64,64,64,16), or auto (each GPU measures its own). A larger share is processed in "
                "micro-batches with gradient accumulation.",
            ),
        ),
        (
            "num-workers",
            click.option(
                "--num-workers",
                type=int,
                default=D.num_workers,
                show_default=True,
                help="DataLoader worker processes per rank (0: load in the training process).",
            ),
        ),
        (
            "prefetch-factor",
            click.option(
                "--prefetch-factor",
                type=int,
                default=D.prefetch_factor,
                show_default=True,
                help="Batches each DataLoader worker loads ahead.",
            ),
        ),
        (
            "pin-memory",
            click.option(
                "--pin-memory/--no-pin-memory",
                default=D.pin_memory,
                show_default=True,
                help="Page-locked batches (faster copies to a GPU).",
            ),
        ),
        (
            "allocation-lag",
            click.option(
                "--allocation-lag",
                type=int,
                default=D.allocation_lag,
                help="Updates between deciding an allocation and using it "
                "(default: num_workers x prefetch_factor + 1, what the loader needs).",
            ),
        ),
        (
            "emulate-speed",
            click.option(
                "--emulate-speed", default=None, help="EMULATION: relative device speed per rank, e.g. 1,1,1,0.33."
            ),
        ),
        (
            "emulate-rate",
            click.option(
                "--emulate-rate",
                type=float,
                default=D.emulate_rate,
                show_default=True,
                help="EMULATION: samples/s of a speed-1 rank.",
            ),
        ),
        (
            "emulate-schedule",
            click.option(
                "--emulate-schedule",
                type=click.Path(dir_okay=False),
                default=D.emulate_schedule,
                help="EMULATION: JSON file of speeds that change at given updates.",
            ),
        ),
        (
            "cpu-quota",
            click.option(
                "--cpu-quota",
                default=None,
                help="REAL slow ranks: share of one CPU core per rank, e.g. 0.5,0.5,0.5,0.17 (cgroup per rank; root).",
            ),
        ),
        (
            "cpu-quota-schedule",
            click.option(
                "--cpu-quota-schedule",
                type=click.Path(dir_okay=False),
                default=D.cpu_quota_schedule,
                help="REAL: JSON file of CPU quotas that change at given updates (a neighbour arriving and leaving).",
            ),
        ),
        (
            "cpu-quota-period",
            click.option(
                "--cpu-quota-period",
                "cpu_quota_period_ms",
                type=float,
                default=D.cpu_quota_period_ms,
                help="REAL: CFS period of the quotas in ms (default 10, longer where a small quota needs it).",
            ),
        ),
        (
            "latency-interval",
            click.option(
                "--latency-interval",
                type=float,
                default=D.latency_interval,
                show_default=True,
                help="Seconds between latency probes (0: off).",
            ),
        ),
        _choice("--dtype", ["float32", "float64"], "Parameter/compute precision (float64 for exactness checks)."),
        _choice(
            "--engine",
            ["horovod", "torch"],
            "What sums the gradients: horovod (horovodrun/mpirun), or torch: torch.distributed over Gloo "
            "(CPU) or NCCL (GPU), under torchrun or mpirun; no Horovod needed.",
        ),
        (
            "collectives",
            click.option(
                "--collectives",
                type=click.Choice(["auto", "mpi", "gloo"]),
                default=D.collectives,
                show_default=True,
                help="What Horovod's allreduce runs on (the control plane is MPI either way). auto: gloo, "
                "whose waits sleep, where any rank runs under a CPU limit (a container's, Slurm's, --cpu-quota: "
                "MPI's waits spin on the quota the rank needs); mpi otherwise and for GPU tensors. With "
                "--engine torch: gloo sums GPU tensors over Gloo too (several ranks on one GPU, GPU ranks beside "
                "CPU ranks); otherwise NCCL on GPUs.",
            ),
        ),
        _choice(
            "--device", ["auto", "cpu", "cuda"], "auto: GPU number local_rank where CUDA is available, else the CPU."
        ),
        (
            "amp",
            click.option(
                "--amp/--no-amp",
                default=D.amp,
                show_default=True,
                help="Mixed precision: float16 with a GradScaler on a GPU, bfloat16 on the CPU.",
            ),
        ),
        (
            "threads",
            click.option("--threads", type=int, default=D.threads, show_default=True, help="torch threads per rank."),
        ),
        (
            "tensorboard",
            click.option(
                "--tensorboard",
                type=click.Path(file_okay=False),
                default=D.tensorboard,
                help="Rank 0 writes TensorBoard events here: per update loss, samples/s, weight-update time, "
                "global batch, lr, compute balance, share outside compute; per rank batch, compute, waiting, "
                "memory; allocation changes (bench and experiment: one sub-directory per run).",
            ),
        ),
    ] + TEXT_OPTIONS
    for name, opt in reversed(MODEL_OPTIONS + opts):
        if name not in exclude:
            fn = opt(fn)
    return fn


def _choice(flag: str, choices: list[str], help: str):
    """A flag whose value is one of ``choices``, its default the TrainConfig field's."""
    name = flag[2:]
    default = getattr(D, name.replace("-", "_"))
    return name, click.option(flag, type=click.Choice(choices), default=default, show_default=True, help=help)


def config_from_flags(**kw) -> TrainConfig:
    """The flags' values as a TrainConfig (list flags parsed, everything validated)."""
    speeds = kw.pop("emulate_speed", None)
    kw["emulate_speed"] = tuple(parse_speeds(speeds)) if speeds else None
    kw["batch_sizes"] = parse_int_list(kw.get("batch_sizes"), "--batch-sizes")
    caps = kw.pop("max_batch", None)
    kw["max_batch_auto"] = caps == "auto"
    kw["max_batch"] = None if caps == "auto" else parse_int_list(caps, "--max-batch", CAP)
    quotas = kw.pop("cpu_quota", None)
    kw["cpu_quota"] = tuple(parse_quotas(quotas)) if quotas else None
    cfg = TrainConfig(**text_values(kw))
    check_lab_config(cfg)
    return cfg
