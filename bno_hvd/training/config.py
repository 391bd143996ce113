"""One frozen dataclass for a training run, and the one home of its defaults.

Config flows one way: click flags (``bno_hvd.cli``) -> :class:`TrainConfig` -> the components
built from it (:mod:`bno_hvd.training.components`). Every default lives here; the flags show these values.
Validation is a table: :data:`FIELD_RULES` (field -> check -> message) and :data:`PAIR_RULES`
(fields that depend on each other). The fields marked ``plugin`` are served by the lab's plugin
(:mod:`bno_hvd.lab.plugin`), which also checks them further.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bno_hvd.allocation import check_spec, split_spec
from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import BATCH, CAP, IMAGE_SIDE, RANKS, SEED, UPDATE, check_per_rank, show_value
from bno_hvd.data.catalog import SYNTHETIC_SIZE
from bno_hvd.library.control.monitor import LATENCY_INTERVAL, PROBE_BYTES
from bno_hvd.training.elasticrules import ELASTIC_RULES
from bno_hvd.training.textrules import TEXT_RULES


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
    exact_batchnorm: bool = True  # BatchNorm with the global batch's statistics (bno_hvd/library/batchnorm.py)
    max_seq_len: int = 256  # text: most predictions per sequence (longer documents are cut into pieces)
    vocab_size: int = 2048  # text: entries of the BPE tokenizer trained on the training documents
    # -- how to split it ----------------------------------------------------------------------
    strategy: str = "balanced"
    base_batch_size: int = 32
    batch_sizes: tuple[int, ...] | None = None  # for --strategy fixed
    global_batch: int | None = None  # for strategies that keep it fixed
    rebalance_every: int = 10
    max_batch: tuple[int, ...] | None = None  # memory cap per forward/backward pass: one, or one per rank
    max_batch_auto: bool = False  # --max-batch auto: each GPU measures its own cap
    max_tokens: tuple[int, ...] | None = None  # text: memory cap in padded tokens per pass, one or one per rank
    allocate_by: str | None = None  # samples, tokens or cost (text); None: cost for text (samples with fixed)
    global_tokens: int | None = None  # text, by tokens or cost: the global batch in tokens instead of sequences
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
    engine: str = "horovod"  # the gradients' allreduce: horovod, or torch (torch.distributed; also under torchrun)
    collectives: str = "auto"  # what Horovod's allreduce runs on: auto, mpi, or gloo (waits without spinning)
    latency_interval: float = LATENCY_INTERVAL  # s between latency probes (0: off)
    probe_bytes: int = PROBE_BYTES  # ping-pong payload of a latency probe
    measure_allreduce: bool = False  # bench: time the allreduce alone at the start (collectives.allreduce_alone)
    # -- heterogeneity ------------------------------------------------------------------------
    emulate_speed: tuple[float, ...] | None = field(default=None, metadata={"plugin": "--emulate-speed"})
    emulate_rate: float = 200.0
    emulate_schedule: str | None = field(default=None, metadata={"plugin": "--emulate-schedule"})
    # REAL: share of one core per rank (cgroup)
    cpu_quota: tuple[float, ...] | None = field(default=None, metadata={"plugin": "--cpu-quota"})
    cpu_quota_schedule: str | None = field(default=None, metadata={"plugin": "--cpu-quota-schedule"})
    cpu_quota_period_ms: float | None = None  # None: 10 ms, longer where a small quota needs it
    # -- outputs ------------------------------------------------------------------------------
    log_dir: str | None = None
    tensorboard: str | None = None  # rank 0 writes TensorBoard events here (bno_hvd.training.tensorboard)
    save_model: str | None = None
    eval: bool = True
    eval_batch_size: int = 1000
    eval_every: int = 0  # test accuracy every K updates (0: only at the end)
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    resume: bool = False
    progress: bool = True
    elastic: bool = False  # ranks may leave and join (bno_hvd.training.elastic, under bno-hvd elastic)
    elastic_timeout: float = 30.0  # s a collective or a re-formation may wait before a rank counts as gone
    # tests only: see bno_hvd.lab.faults
    inject_fault: str | None = field(default=None, metadata={"plugin": "--inject-fault"})

    def __post_init__(self) -> None:
        for rule in FIELD_RULES:
            rule.check(self)
        try:  # a strategy and its options (balanced:deadband=0.1): the strategy's own checks
            check_spec(self.strategy)
        except UsageError as err:
            raise UsageError(f"--strategy: {err}") from None
        for needs, message in PAIR_RULES + TEXT_RULES:
            if needs(self):
                raise UsageError(message(self))

    def plugin_flags(self) -> list[str]:
        """The flags set here that only a plugin serves (the lab's: emulation, CPU quotas, faults)."""
        return [
            f.metadata["plugin"] for f in dataclasses.fields(self) if "plugin" in f.metadata and getattr(self, f.name)
        ]

    def world_options(self) -> dict:
        """What :func:`bno_hvd.processes.world.init_world` takes from this config."""
        throttled = bool(self.cpu_quota or self.cpu_quota_schedule)
        return {"collectives": self.collectives, "device": self.device, "throttled": throttled, "engine": self.engine}

    def check_world(self, size: int) -> None:
        """Checks that need the number of ranks (same result on every rank)."""
        if split_spec(self.strategy)[0] == "fixed" and self.batch_sizes is None:
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
        if self.max_tokens is not None and len(self.max_tokens) not in (1, size):
            raise UsageError(
                f"--max-tokens has {len(self.max_tokens)} entries but the job has {size} ranks; "
                "give one cap for every rank or one per rank"
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
    def allocation_unit(self) -> str:
        """What the strategy splits: ``samples`` (counts), or shares of ``tokens`` or ``cost`` (text)."""
        if self.allocate_by is not None:
            return self.allocate_by
        return "cost" if self.dataset == "text" and self.strategy != "fixed" else "samples"

    def token_cap_of(self, rank: int) -> int | None:
        """Rank ``rank``'s memory cap in padded tokens per pass (text), None without one."""
        if self.max_tokens is None:
            return None
        return self.max_tokens[0] if len(self.max_tokens) == 1 else self.max_tokens[rank]

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


@dataclass(frozen=True)
class Rule:
    """One field's check: ``ok(value)`` or :class:`UsageError` with ``message`` (a format string
    over ``value``, its ``shown`` form for long or odd values, and ``listed``: a list as typed)."""

    name: str
    ok: Callable[[Any], bool]
    message: str

    def check(self, cfg) -> None:
        value = getattr(cfg, self.name)
        if not self.ok(value):
            listed = _show(value) if isinstance(value, (tuple, list)) else value
            raise UsageError(self.message.format(value=value, shown=show_value(value), listed=listed))


def _positive(name: str) -> Rule:
    return Rule(
        name,
        lambda v: v is not None and v >= 1,
        f"--{name.replace('_', '-')} must be a positive integer, got {{value}}",
    )


def _at_most(flag: str, name: str, high: float, low: int = 1) -> Rule:
    return Rule(name, lambda v: v <= high, f"{flag} must be between {low} and {high}, got {{shown}}")


def _choice(flag: str, name: str, choices: tuple[str, ...]) -> Rule:
    return Rule(name, lambda v: v in choices, f"{flag} {{value!r}}: use {' or '.join(choices)}")


def _optional(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or test(v)


# field -> check -> message, in the order a user meets them (the first failing rule is reported)
FIELD_RULES: tuple[Rule, ...] = (
    *(
        _positive(name)
        for name in (
            "base_batch_size",
            "updates",
            "rebalance_every",
            "threads",
            "eval_batch_size",
            "image_size",
            "prefetch_factor",
        )
    ),
    _at_most("--base-batch-size", "base_batch_size", CAP.high),
    _at_most("--threads", "threads", 256),
    _at_most("--image-size", "image_size", IMAGE_SIDE.high),
    _at_most("--num-workers", "num_workers", 64, low=0),
    _at_most("--prefetch-factor", "prefetch_factor", 64),
    # counts of updates: beyond 1e9 nothing runs to the end (and numpy's int64 is not far)
    _at_most("--updates", "updates", UPDATE.high),
    _at_most("--rebalance-every", "rebalance_every", UPDATE.high),
    Rule("num_workers", lambda v: v >= 0, "--num-workers must be >= 0 (0: load in the training process), got {value}"),
    Rule("allocation_lag", _optional(lambda v: v >= 1), "--allocation-lag must be a positive integer, got {value}"),
    Rule(
        "num_classes",
        _optional(lambda v: 1 <= v <= 1_000_000),
        "--num-classes must be between 1 and 1000000, got {value}",
    ),
    Rule("seed", SEED.contains, f"--seed must be an integer {SEED.describe()}, got {{shown}}"),
    Rule("lr", lambda v: v > 0 and v != math.inf, "--lr must be a positive number, got {value}"),
    Rule("momentum", lambda v: 0 <= v < math.inf, "--momentum must be a number >= 0 (0.9 is usual), got {value}"),
    Rule("keep_checkpoints", lambda v: v >= 1, "--keep-checkpoints must be a positive integer, got {value}"),
    Rule(
        "emulate_rate",
        lambda v: 0.1 <= v <= 1e7,
        "--emulate-rate must be a positive number of samples/s between 0.1 and 1e7, got {value}",
    ),
    _choice("--device", "device", ("auto", "cpu", "cuda")),
    _choice("--collectives", "collectives", ("auto", "mpi", "gloo")),
    _choice("--engine", "engine", ("horovod", "torch")),
    _choice("--optimizer", "optimizer", ("sgd", "adam")),
    _choice("--dtype", "dtype", ("float32", "float64")),
    _choice("--lr-scaling", "lr_scaling", ("linear", "none")),
    Rule(
        "batch_sizes",
        _optional(lambda v: all(b >= 1 for b in v)),
        "--batch-sizes must all be positive integers, got {listed}",
    ),
    Rule("global_batch", _optional(lambda v: v >= 1), "--global-batch must be a positive integer, got {value}"),
    Rule(
        "max_batch",
        _optional(lambda v: all(1 <= c <= CAP.high for c in v)),
        f"--max-batch caps must be integers {CAP.describe()}, got {{listed}}",
    ),
    Rule(
        "global_batch",
        _optional(lambda v: v <= RANKS.high * BATCH.high),
        f"--global-batch must be between 1 and {RANKS.high * BATCH.high}, got {{shown}}",
    ),
    Rule("checkpoint_every", lambda v: v >= 0, "--checkpoint-every must be >= 0, got {value}"),
    Rule("eval_every", lambda v: v >= 0, "--eval-every must be >= 0 (0: evaluate only at the end), got {value}"),
    # below 10 ms the probe thread would ping-pong without pause and starve training
    Rule(
        "latency_interval",
        lambda v: v == 0 or 0.01 <= v <= 86400,
        "--latency-interval must be >= 0: 0 turns latency probing off, else between 0.01 and 86400 s; got {value:g}",
    ),
    Rule("probe_bytes", lambda v: v >= 8, "probe_bytes must be >= 8, got {value}"),
    Rule(
        "cpu_quota_period_ms",
        _optional(lambda v: 1 <= v <= 1000),
        "--cpu-quota-period must be between 1 and 1000 ms, got {value}",
    ),
)


def _lag_too_small(cfg) -> bool:
    return cfg.allocation_lag is not None and cfg.allocation_lag < cfg.num_workers * cfg.prefetch_factor + 1


# checks of two fields together: (fails?, message)
PAIR_RULES: tuple[tuple[Callable[[Any], bool], Callable[[Any], str]], ...] = (
    (
        _lag_too_small,
        lambda c: (
            f"--allocation-lag {c.allocation_lag} is too small: --num-workers {c.num_workers} x "
            f"--prefetch-factor {c.prefetch_factor} reads {c.num_workers * c.prefetch_factor} batches ahead, so "
            f"allocations need a lag of at least {c.num_workers * c.prefetch_factor + 1}; raise it or leave it unset"
        ),
    ),
    (
        lambda c: c.allocation_lag is not None and c.allocation_lag > UPDATE.high,
        lambda c: f"--allocation-lag must be between 1 and {UPDATE.high}, got {show_value(c.allocation_lag)}",
    ),
    (lambda c: c.checkpoint_every and not c.checkpoint_dir, lambda c: "--checkpoint-every needs --checkpoint-dir DIR"),
    (lambda c: c.resume and not c.checkpoint_dir, lambda c: "--resume needs --checkpoint-dir DIR"),
    (lambda c: c.eval_every and not c.eval, lambda c: "--eval-every needs the test split; drop --no-eval"),
    *ELASTIC_RULES,
    (
        lambda c: c.cpu_quota is not None and c.cpu_quota_schedule is not None,
        lambda c: "give --cpu-quota or --cpu-quota-schedule, not both",
    ),
)
