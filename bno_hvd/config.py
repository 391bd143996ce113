"""One frozen dataclass for a training run, and the one home of its defaults.

Config flows one way: click flags (``bno_hvd.commands``) -> :class:`TrainConfig` -> the components
built from it (:mod:`bno_hvd.components`). Every default lives here; the flags show these values.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .catalog import SYNTHETIC_SIZE
from .control.monitor import LATENCY_INTERVAL, PROBE_BYTES
from .emulation import check_emulated_rate
from .errors import UsageError
from .faults import parse_faults
from .parsing import BATCH, CAP, IMAGE_SIDE, RANKS, SEED, UPDATE, check_per_rank, show_value


@dataclass(frozen=True)
class TrainConfig:
    # -- what to train ------------------------------------------------------------------------
    model: str = "cnn"  # built-in name, torchvision name, or module:function
    num_classes: int | None = None  # None: the dataset's
    dataset: str = "fashion-mnist"
    data_dir: str | None = None
    image_size: int = 64  # imagefolder: side of the square crops
    synthetic_size: int = SYNTHETIC_SIZE
    dtype: str = "float32"  # float64 for exactness checks
    # -- how to split it ----------------------------------------------------------------------
    strategy: str = "balanced"
    base_batch_size: int = 32
    batch_sizes: tuple[int, ...] | None = None  # for --strategy fixed
    global_batch: int | None = None  # for strategies that keep it fixed
    rebalance_every: int = 10
    max_batch: tuple[int, ...] | None = None  # memory cap per forward/backward pass: one, or one per rank
    max_batch_auto: bool = False  # --max-batch auto: each GPU measures its own cap
    # -- the optimisation ---------------------------------------------------------------------
    updates: int = 600
    lr: float = 0.02
    lr_scaling: str = "linear"
    optimizer: str = "sgd"
    momentum: float = 0.9
    seed: int = 0
    # -- the data loader ----------------------------------------------------------------------
    num_workers: int = 0  # DataLoader worker processes per rank
    prefetch_factor: int = 2  # batches each worker loads ahead
    pin_memory: bool = False
    allocation_lag: int | None = None  # None: num_workers * prefetch_factor + 1
    # -- the machine --------------------------------------------------------------------------
    device: str = "auto"  # auto: GPU local_rank where CUDA is available, else the CPU
    amp: bool = False  # mixed precision (float16 + GradScaler on a GPU, bfloat16 on the CPU)
    threads: int = 1  # torch threads per rank
    collectives: str = "mpi"  # what Horovod's allreduce runs on: mpi, or gloo (waits without spinning)
    latency_interval: float = LATENCY_INTERVAL  # s between latency probes (0: off)
    probe_bytes: int = PROBE_BYTES  # ping-pong payload of a latency probe
    measure_allreduce: bool = False  # bench: time the allreduce alone at the start (collectives.allreduce_alone)
    # -- heterogeneity ------------------------------------------------------------------------
    emulate_speed: tuple[float, ...] | None = None
    emulate_rate: float = 200.0
    emulate_schedule: str | None = None
    cpu_quota: tuple[float, ...] | None = None  # REAL: share of one core per rank (cgroup)
    cpu_quota_schedule: str | None = None
    cpu_quota_period_ms: float | None = None  # None: 10 ms, longer where a small quota needs it
    # -- outputs ------------------------------------------------------------------------------
    log_dir: str | None = None
    tensorboard: str | None = None  # rank 0 writes TensorBoard events here (bno_hvd.tensorboard)
    save_model: str | None = None
    eval: bool = True
    eval_batch_size: int = 1000
    eval_every: int = 0  # test accuracy every K updates (0: only at the end)
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    resume: bool = False
    progress: bool = True
    inject_fault: str | None = None  # tests only: see bno_hvd.faults

    def __post_init__(self) -> None:
        positive = {
            "base_batch_size": self.base_batch_size,
            "updates": self.updates,
            "rebalance_every": self.rebalance_every,
            "threads": self.threads,
            "eval_batch_size": self.eval_batch_size,
            "image_size": self.image_size,
            "prefetch_factor": self.prefetch_factor,
        }
        for name, value in positive.items():
            if value is None or value < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
        _at_most("--base-batch-size", self.base_batch_size, CAP.high)
        _at_most("--threads", self.threads, 256)
        _at_most("--image-size", self.image_size, IMAGE_SIDE.high)
        _at_most("--num-workers", self.num_workers, 64, low=0)
        _at_most("--prefetch-factor", self.prefetch_factor, 64)
        # counts of updates: beyond 1e9 nothing runs to the end (and numpy's int64 is not far)
        for flag, value in (("--updates", self.updates), ("--rebalance-every", self.rebalance_every)):
            _at_most(flag, value, UPDATE.high)
        if self.num_workers < 0:
            raise UsageError(f"--num-workers must be >= 0 (0: load in the training process), got {self.num_workers}")
        if self.allocation_lag is not None and self.allocation_lag < 1:
            raise UsageError(f"--allocation-lag must be a positive integer, got {self.allocation_lag}")
        depth = self.num_workers * self.prefetch_factor
        if self.allocation_lag is not None and self.allocation_lag < depth + 1:
            raise UsageError(
                f"--allocation-lag {self.allocation_lag} is too small: --num-workers {self.num_workers} x "
                f"--prefetch-factor {self.prefetch_factor} reads {depth} batches ahead, so allocations need "
                f"a lag of at least {depth + 1}; raise it or leave it unset"
            )
        if self.allocation_lag is not None:
            _at_most("--allocation-lag", self.allocation_lag, UPDATE.high)
        if self.num_classes is not None and not 1 <= self.num_classes <= 1_000_000:
            raise UsageError(f"--num-classes must be between 1 and 1000000, got {self.num_classes}")
        if not SEED.contains(self.seed):
            raise UsageError(f"--seed must be an integer {SEED.describe()}, got {show_value(self.seed)}")
        if not self.lr > 0 or self.lr == math.inf:
            raise UsageError(f"--lr must be a positive number, got {self.lr}")
        if not 0 <= self.momentum < math.inf:
            raise UsageError(f"--momentum must be a number >= 0 (0.9 is usual), got {self.momentum}")
        if not self.keep_checkpoints >= 1:
            raise UsageError(f"--keep-checkpoints must be a positive integer, got {self.keep_checkpoints}")
        if not 0.1 <= self.emulate_rate <= 1e7:
            raise UsageError(
                f"--emulate-rate must be a positive number of samples/s between 0.1 and 1e7, got {self.emulate_rate}"
            )
        if self.emulate_speed is not None:
            check_emulated_rate(self.emulate_speed, self.emulate_rate)
        for flag, value, choices in (
            ("--device", self.device, ("auto", "cpu", "cuda")),
            ("--collectives", self.collectives, ("mpi", "gloo")),
            ("--optimizer", self.optimizer, ("sgd", "adam")),
            ("--dtype", self.dtype, ("float32", "float64")),
            ("--lr-scaling", self.lr_scaling, ("linear", "none")),
        ):
            if value not in choices:
                raise UsageError(f"{flag} {value!r}: use {' or '.join(choices)}")
        if self.batch_sizes is not None and any(b < 1 for b in self.batch_sizes):
            raise UsageError(f"--batch-sizes must all be positive integers, got {','.join(map(str, self.batch_sizes))}")
        if self.global_batch is not None and self.global_batch < 1:
            raise UsageError(f"--global-batch must be a positive integer, got {self.global_batch}")
        if self.max_batch is not None and any(not 1 <= c <= CAP.high for c in self.max_batch):
            raise UsageError(f"--max-batch caps must be integers {CAP.describe()}, got {_show(self.max_batch)}")
        if self.global_batch is not None:
            _at_most("--global-batch", self.global_batch, RANKS.high * BATCH.high)
        if self.checkpoint_every < 0:
            raise UsageError(f"--checkpoint-every must be >= 0, got {self.checkpoint_every}")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise UsageError("--checkpoint-every needs --checkpoint-dir DIR")
        if self.resume and not self.checkpoint_dir:
            raise UsageError("--resume needs --checkpoint-dir DIR")
        if self.eval_every < 0:
            raise UsageError(f"--eval-every must be >= 0 (0: evaluate only at the end), got {self.eval_every}")
        if self.eval_every and not self.eval:
            raise UsageError("--eval-every needs the test split; drop --no-eval")
        if not (self.latency_interval == 0 or 0.01 <= self.latency_interval <= 86400):
            # below 10 ms the probe thread would ping-pong without pause and starve training
            raise UsageError(
                "--latency-interval must be >= 0: 0 turns latency probing off, else between 0.01 and 86400 s; "
                f"got {self.latency_interval:g}"
            )
        if not self.probe_bytes >= 8:
            raise UsageError(f"probe_bytes must be >= 8, got {self.probe_bytes}")
        if self.cpu_quota is not None and self.cpu_quota_schedule is not None:
            raise UsageError("give --cpu-quota or --cpu-quota-schedule, not both")
        if self.cpu_quota_period_ms is not None and not 1 <= self.cpu_quota_period_ms <= 1000:
            raise UsageError(f"--cpu-quota-period must be between 1 and 1000 ms, got {self.cpu_quota_period_ms}")
        parse_faults(self.inject_fault)

    def check_world(self, size: int) -> None:
        """Checks that need the number of ranks (same result on every rank)."""
        if self.strategy == "fixed" and self.batch_sizes is None:
            raise UsageError("--strategy fixed needs --batch-sizes, one per rank, e.g. --batch-sizes 5,11,3,13")
        if self.batch_sizes is not None and len(self.batch_sizes) != size:
            raise UsageError(
                f"--batch-sizes has {len(self.batch_sizes)} entries but the job has {size} ranks; give one per rank"
            )
        if self.emulate_speed is not None and len(self.emulate_speed) != size:
            raise UsageError(
                f"--emulate-speed has {len(self.emulate_speed)} entries but the job has {size} ranks; give one per rank"
            )
        if self.cpu_quota is not None:
            check_per_rank("--cpu-quota", len(self.cpu_quota), size)
        if self.global_batch is not None and self.global_batch < size:
            raise UsageError(
                f"--global-batch {self.global_batch} is smaller than the {size} ranks; every rank needs >= 1 sample"
            )
        if self.max_batch is not None and len(self.max_batch) not in (1, size):
            raise UsageError(
                f"--max-batch has {len(self.max_batch)} entries but the job has {size} ranks; "
                "give one cap for every rank or one per rank"
            )

    def cap_of(self, rank: int) -> int | None:
        """Rank ``rank``'s memory cap (samples per forward/backward pass), None without one."""
        if self.max_batch is None:
            return None
        return self.max_batch[0] if len(self.max_batch) == 1 else self.max_batch[rank]

    @property
    def emulated(self) -> bool:
        return self.emulate_speed is not None or self.emulate_schedule is not None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """Unknown keys fail loudly (a config written by another version, or a typo)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"unknown config key(s) {unknown}; known: {', '.join(sorted(known))}")
        return cls(**data)


def _show(values) -> str:
    return ",".join(map(str, values))


def _at_most(flag: str, value: int, high: float, low: int = 1) -> None:
    if value > high:
        raise UsageError(f"{flag} must be between {low} and {high}, got {show_value(value)}")
