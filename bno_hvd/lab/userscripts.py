"""A user's own training script against its plain twin, under REAL CPU limits set outside bno-hvd
(``benchmarks/dropin_real.py``): the arithmetic, without processes.

Each *variant* is one script run the way its user runs it: the plain Horovod, DDP, Lightning or
Accelerate script (the twin of an example, its ``# bno-hvd:`` lines put back:
``tests/support/port_twin.py``) or the
example itself, the port, with a ``--strategy`` (the Lightning example's plain twin runs
Lightning's own DDPStrategy); or ``bno-hvd train`` on the Horovod example's model (``--model
examples.horovod_mnist:Net``, the same data and per-rank batch) against that example's plain
twin. Every rank is timed from outside
(:mod:`bno_hvd.lab.stamps`: the end of every ``optimizer.step()``); a run's rate is rank 0's
samples per second over the updates after a warm-up (rank 0 never sits an update out). Variants
run in interleaved rounds in a new random order each (:func:`bno_hvd.lab.pairing.round_orders`)
and each port's rate is divided by the plain script's of the same round.

Usage::

    runs = variants("horovod", ["balanced", "equal"])        # plain, port:balanced, port:equal
    rate = stamps_rate(steps, global_batch=128, warmup=30)   # samples/s over updates 30..end
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bno_hvd.lab.pairing import comparison

SCRIPTS = {  # a kind of script -> the example its port is (or bno-hvd's command), and how its users launch it
    "horovod": ("examples/horovod_mnist.py", "mpirun"),
    "ddp": ("examples/ddp_mnist.py", "torchrun"),
    "train": ("bno_hvd/__main__.py", "mpirun"),  # bno-hvd train on the Horovod example's Net, against its plain twin
    "lightning": ("examples/lightning_mnist.py", "torchrun"),  # Lightning runs under torchrun as its DDP docs show
    "accelerate": ("examples/accelerate_mnist.py", "torchrun"),
    "trainer": ("examples/hf_trainer_text.py", "torchrun"),  # the HF Trainer on text: --max-steps, 8 sequences
}
TWIN_OF = {"train": "horovod"}  # a kind whose plain script is another kind's twin
FLAGS = {"accelerate": ("--cpu",), "trainer": ("--cpu",)}  # what a kind's scripts take besides the common flags
PER_RANK = {"trainer": 8}  # samples (sequences) per rank and update where a kind's is not the benchmark's 32
PLAIN = "plain"


@dataclass(frozen=True)
class Variant:
    """One way to run one kind of script: its name in the tables, the script, its extra arguments."""

    kind: str  # a key of SCRIPTS
    name: str  # "plain", "port:<strategy>" or "train:<strategy>"
    script: str  # the example (the port), or "twin" for its plain twin (written by the benchmark)
    args: tuple[str, ...] = ()

    @property
    def launcher(self) -> str:
        return SCRIPTS[self.kind][1]


def variants(kind: str, strategies: list[str]) -> list[Variant]:
    """The plain twin of ``kind``'s example, and its port with each strategy (the first is the
    port's default flags when it is ``balanced``, the examples' default). A strategy may carry
    more of the port's flags after a space (``"balanced --local-batchnorm"``)."""
    example = SCRIPTS[kind][0]
    flags = FLAGS.get(kind, ())
    runs = [Variant(kind, PLAIN, "twin", flags)]
    prefix = "train" if kind == "train" else "port"  # bno-hvd's own loop, or the script's port
    for entry in strategies:
        strategy, *more = words = entry.split()
        runs.append(Variant(kind, f"{prefix}:{' '.join(words)}", example, (*flags, "--strategy", strategy, *more)))
    return runs


def stamps_rate(steps: list[float], global_batch: int, warmup: int) -> float:
    """Samples per second over the updates that end after update ``warmup``: the updates between
    the end of update ``warmup - 1`` and the last one, at ``global_batch`` samples each."""
    if warmup < 1 or len(steps) <= warmup:
        return math.nan
    seconds = steps[-1] - steps[warmup - 1]
    return (len(steps) - warmup) * global_batch / seconds if seconds > 0 else math.nan


def stamps_cpu(cpu: list[float], warmup: int) -> float:
    """The rank's CPU milliseconds per update (every thread; what a CFS quota rations) over the
    updates :func:`stamps_rate` times."""
    if warmup < 1 or len(cpu) <= warmup:
        return math.nan
    return 1000 * (cpu[-1] - cpu[warmup - 1]) / (len(cpu) - warmup)


def summarize(rates: dict[str, list[float]], seed: int = 0) -> dict[str, dict]:
    """Per variant: its rates per round, its paired ratios to the plain script with their median
    and 95% interval (:func:`bno_hvd.lab.pairing.comparison`)."""
    table = comparison(rates, PLAIN, seed)
    for row in table.values():  # the peers are other strategies in a suite; here they mean nothing
        for key in ("vs_best_peer", "top_peer", "vs_top_peer"):
            row.pop(key, None)
    return table


def format_rows(profile: str, kind: str, table: dict[str, dict]) -> list[str]:
    """Markdown rows: profile, script, variant, median samples/s, x plain [95% interval]."""
    rows = []
    for name, row in table.items():
        rates = sorted(r for r in row["rates"] if r is not None)
        median = rates[len(rates) // 2] if rates else math.nan
        if name == PLAIN:
            ratio = "1"
        elif row["median"] is None:
            ratio = "-"
        elif row["low"] is None:
            ratio = f"{row['median']:.2f}"
        else:
            ratio = f"**{row['median']:.2f}** [{row['low']:.2f}, {row['high']:.2f}]"
        rows.append(f"| {profile} | {kind} | {name} | {median:.0f} | {ratio} |")
    return rows


TABLE_HEAD = (
    "| profile | script | run | samples/s (median) | × plain, paired per round [95% interval] |\n|---|---|---|---|---|"
)
