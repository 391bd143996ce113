"""The library's public entry points as fuzz surfaces: what a caller may pass, and the call.

Each entry point has a table of arguments, ``name -> (good values, bad values)``, and a ``run``
that makes the calls a script would make, in this process, in a world of one rank
(``MPI.COMM_SELF``, Horovod initialised once). Hypothesis draws one byte per argument
(:func:`decode`): below 240 it picks a good value, else a bad one (so about one argument in
sixteen is bad, and calls with every argument good reach the deep paths); a byte of 0 picks the
first good value, which is where Hypothesis shrinks a failure to. Values that must be fresh for
each call (a Balancer, a dataset, a model) are names (``"@balancer"``) resolved by the runs.
The model's side (DistributedOptimizer, exact_dropout) is in :mod:`support.fuzz_api_model`.
``tests/library/test_fuzz_api.py`` holds each entry point to :mod:`support.fuzz_property`'s
property: a result, or a one-line UsageError.
"""

from __future__ import annotations

import math

import torch
from support.fuzz_strategies import ODD_FLOATS, ODD_INTS

import bno_hvd as bno
from bno_hvd.allocation import STRATEGY_NAMES
from bno_hvd.allocation.costmodel import SequenceCost

ABSENT = "@absent"  # the keyword is not passed
BAD_FROM = 240  # a byte from here on picks a bad value

# what a caller might pass by mistake: edge numbers, text with line breaks, containers, objects
JUNK = (
    *ODD_FLOATS,
    *ODD_INTS,
    None,
    True,
    False,
    "10",
    "1.5",
    "",
    "a\nb",
    "\x00\u2028",
    "balanced",
    b"8",
    [1, 2],
    (3,),
    {"a": 1},
    object(),
    torch.zeros(2),
    print,
    10**400,
    -(2**70),
)


def decode(table: dict, data: bytes) -> dict:
    """The arguments ``data`` picks from ``table`` (one byte per argument, in the table's order)."""
    out = {}
    for (name, (good, bad)), b in zip(table.items(), data):
        value = good[b % len(good)] if b < BAD_FROM else bad[b % len(bad)]
        if not (isinstance(value, str) and value == ABSENT):
            out[name] = value
    return out


def mark(value):
    """``value`` when it is text (a marker such as ``"@balancer"`` is), else None: a drawn tensor
    compared with ``==`` would not give a bool."""
    return value if isinstance(value, str) else None


def arg(good, bad=JUNK):
    return tuple(good), tuple(bad)


def optional(good, bad=JUNK):
    return arg((ABSENT, *good), bad)


class NoLen:
    """A dataset without ``__len__`` (an iterable-style one)."""

    def __getitem__(self, i):
        return torch.tensor([float(i)])


class OddLen:
    """A map-style dataset whose ``__len__`` returns what it was given (negative, a float, 2**70)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(i)])


ODD_LENGTHS = [OddLen(v) for v in (-1, 0, 1.5, "3", 2**70)]
DATASETS = ("@list", "@tensors", "@length", "@list+1", "@empty", "@nolen", *ODD_LENGTHS)


def dataset(spec, n):
    """A drawn dataset of ``n`` samples (or one that is not what it should be)."""
    made = {
        "@list": lambda: list(range(n)),
        "@tensors": lambda: torch.utils.data.TensorDataset(torch.arange(n, dtype=torch.float64)),
        "@length": lambda: n,
        "@list+1": lambda: list(range(n + 1)),
        "@empty": lambda: [],
        "@nolen": NoLen,
    }
    return made[spec]() if isinstance(spec, str) and spec in made else spec


# -- make_strategy -----------------------------------------------------------------------------

SPECS = ("balanced:deadband=0.1", "balanced:sit_out=0:jump=2", "bno:x=1", "random:", "fixed:a=1", "balanced:window=0")
STRATEGY = {
    "name": arg(STRATEGY_NAMES, (*SPECS, *JUNK)),
    "n_ranks": arg(range(1, 10)),
    "base_batch_size": arg(range(1, 65)),
    "global_batch": optional((ABSENT,) * 600 + tuple(range(1, 600))),
    "seed": optional((0, 1, 7, 2**32 - 1), (2**32, -1, *JUNK)),
    "batch_sizes": optional((ABSENT,) * 30 + ([8], [1, 2], [5, 11, 3, 13], [0, 4], [], list(range(1, 10)))),
    # balanced's own options (another strategy has none of them), mostly not passed
    "starved_share": optional((ABSENT,) * 40 + (0.0, 0.5, 1.0, 1.5, -0.1, math.nan)),
    "deadband": optional((ABSENT,) * 40 + (0.05, 0.2, 2.0)),
    "sit_out": optional((ABSENT,) * 40 + (0, 4, -1, 1.5)),
    "window": optional((ABSENT,) * 40 + (1, 16, 0, 10**7)),
}


def run_make_strategy(args, world):
    name, n, b = args.pop("name"), args.pop("n_ranks"), args.pop("base_batch_size")
    strategy = bno.make_strategy(name, n, b, **args)
    sizes = strategy.initial()
    assert len(sizes) == strategy.n_ranks and min(sizes) >= 1, sizes
    assert strategy.changes_global_batch or sum(sizes) == strategy.global_batch, sizes
    return strategy


# -- Balancer, and the calls a loop makes on it ---------------------------------------------------

BALANCER_OPTIONS = {
    "seed": optional((0, 3, 2**32 - 1)),
    "rebalance_every": optional(range(1, 5)),
    "window": optional((1, 2, 20)),
    "max_batch": optional((None, 1, 3, 64, 10**6), (0, -1, 10**7, *JUNK)),
    "lag": optional((None, 1, 2, 5), (0, -1, *JUNK)),
    "sit_out": optional((False, True)),
    "monitor": optional((None,)),
}
BALANCER = {
    "comm": arg(("@self",)),
    "strategy": arg(("equal", "balanced", "random", "bno"), ("@7 ranks", "@2 ranks", *JUNK)),
    "dataset_len": arg(range(1, 200), (0, -5, *JUNK)),
    **BALANCER_OPTIONS,
    # text=TextOptions(...): "@lengths" one per sample, "@lengths-1" one short; a token cap; or junk
    "text": optional((None, "@lengths", "@lengths:40", [1, 2], [0] * 200, "@lengths-1", "@cap"), JUNK),
}
CALLS = {  # call -> its arguments' values (a byte picks one; no tuple: no argument)
    "start_step": (None, *JUNK[:6]),
    "end_compute": (),
    "end_step": (),
    "finish_step": (),
    "batches": (0, 1, 3, 6, -1, "3", None, 2.5),
    "lr_scale": ("linear", "none", "sqrt", None, 3),
    "set_epoch": (0, 1, None, "x"),
    "load_state_dict": ("@own", {}, None, {"plan": None}, {"plan": {"lag": 1}}, 3),
    "len": (),
    "rebalance": (),
}
CALL_NAMES = tuple(CALLS)
LOOP = [None] * 3  # what a loop iterates over in batches(); each item here is one update


def strategy_for(spec, n_ranks=1):
    """A drawn strategy: a name (built for ``n_ranks``), one made for more ranks than the world has, or junk."""
    if mark(spec) in ("@7 ranks", "@2 ranks"):
        return bno.make_strategy("equal", int(spec[1]), 4)
    if isinstance(spec, str) and spec in STRATEGY_NAMES:
        return bno.make_strategy(spec, n_ranks, 4)
    return spec


def run_balancer(args, world, calls=b""):
    n = args["dataset_len"]
    text = args.get("text")
    if isinstance(text, list) or mark(text) in ("@lengths", "@lengths:40", "@lengths-1", "@cap"):
        count = n if isinstance(n, int) and 0 < n < 1000 else 3
        lengths = [1 + i % 7 for i in range(count - (text == "@lengths-1"))] if isinstance(text, str) else text
        cap = {"@lengths:40": 40, "@cap": 8}.get(text) if isinstance(text, str) else None
        args["text"] = bno.TextOptions(lengths=None if text == "@cap" else lengths, max_tokens=cap)
    strategy = strategy_for(args.pop("strategy"))
    comm = args.pop("comm")
    bal = bno.Balancer(world.comm if mark(comm) == "@self" else comm, strategy, args.pop("dataset_len"), **args)
    run_calls(bal, calls)
    return bal


def run_calls(bal, calls: bytes):
    """The calls ``calls`` picks (two bytes each: which, and its argument), in order; each must
    work or raise a one-line UsageError, and the balancer stays usable after a refusal."""
    from support.fuzz_property import result_or_one_line

    for which, b in zip(calls[::2], calls[1::2]):
        name = CALL_NAMES[which % len(CALL_NAMES)]
        values = CALLS[name]
        args = (values[b % len(values)],) if values else ()
        done = bal.update
        if name == "batches":
            result_or_one_line(lambda a=args: [bal.finish_step() or bal.start_step() for _ in bal.batches(LOOP, *a)])
        elif name == "load_state_dict" and mark(args[0]) == "@own":
            bal.load_state_dict(bal.state_dict())
        elif name == "len":
            assert 1 <= len(bal) <= bal.sampler.dataset_len
        elif name == "start_step" and args[0] is None:
            step = bal.start_step()
            assert len(step.indices) == step.size == step.batch_sizes[0] and 0 < step.weight <= 1
        else:
            result_or_one_line(lambda f=getattr(bal, name), a=args: f(*a))
        assert bal.update >= done and sum(bal.batch_sizes) >= 1


# -- Balancer.for_world ----------------------------------------------------------------------------

FOR_WORLD = {
    "dataset": arg(DATASETS[:3], (*DATASETS[3:], *JUNK)),
    "n": arg(range(1, 300), range(1, 300)),  # the dataset's size, when it has one
    "batch_size": arg(range(1, 65)),
    "strategy": optional(("equal", "balanced", "random", "bno"), ("fixed", *SPECS, "@7 ranks", *JUNK)),
    "global_batch": optional((ABSENT,) * 10 + (None, 8, 64, 299), (0, *JUNK)),
    "comm": optional(("@self", None)),
    **{k: v for k, v in BALANCER_OPTIONS.items() if k != "seed"},
    "seed": optional((0, 1, 2**32 - 1)),
    "bogus_option": optional(()),
    # token sequences: "@lengths" one per sample, "@lengths-1" one short; a cost; a global batch in tokens
    "lengths": optional((ABSENT,) * 10 + ("@lengths",) * 6 + ("@lengths-1", [1, 2], [0] * 300)),
    "cost": optional((ABSENT,) * 12 + ("tokens", "@cost", "@zero cost", None)),
    "global_tokens": optional((ABSENT,) * 24 + (None, 1, 50, 10**6), (0, -1, *JUNK)),
}


def run_for_world(args, world):
    if mark(args.get("comm")) == "@self":
        args["comm"] = world.comm
    if "strategy" in args:
        args["strategy"] = strategy_for(args["strategy"])
    n = args.pop("n")
    data = dataset(args.pop("dataset"), n)
    if mark(args.get("lengths")) in ("@lengths", "@lengths-1"):
        args["lengths"] = [1 + i % 7 for i in range(n - (args["lengths"] == "@lengths-1"))]
    if mark(args.get("cost")) in ("@cost", "@zero cost"):
        args["cost"] = SequenceCost(1e-4, 2e-6, 1e-8) if args["cost"] == "@cost" else SequenceCost(0.0, 0.0, 0.0)
    bal = bno.Balancer.for_world(data, args.pop("batch_size"), **args)
    try:
        assert bal.size == 1 and len(bal) == bal.sampler.dataset_len == (data if isinstance(data, int) else len(data))
        assert bal.lr_scale() == bal.strategy.global_batch / bal.strategy.base_batch_size
    finally:
        if args.get("comm") is None:
            bal.control.plane.comm.Free()  # for_world's own duplicate of COMM_WORLD
    return bal


# -- bno.DataLoader --------------------------------------------------------------------------------

LOADER = {
    "n": arg(range(1, 60), range(1, 60)),  # the dataset's size, when it has one
    "dataset": arg(DATASETS[:2], (*DATASETS[2:], *JUNK)),
    "sampler": arg(("@balancer",)),
    "num_workers": optional((0, 1, 2), (-1, *JUNK)),
    "prefetch_factor": optional((None, 1, 4), (0, *JUNK)),
    "pin_memory": optional((False,)),
    "timeout": optional((0, 0.5, 5), (-1, *JUNK)),
    "collate_fn": optional((None, "@collate")),
    "worker_init_fn": optional((None,)),
    "persistent_workers": optional((False, True)),
    "multiprocessing_context": optional((None, "spawn", "fork"), ("nonsense", *JUNK)),
    "generator": optional((None, "@generator")),
    "in_order": optional((True,), (False, *JUNK)),
    "seed_samples": optional((True, False)),
    "batch_size": optional((), (4, *JUNK)),
    "shuffle": optional((), (True, *JUNK)),
    "bogus_option": optional(()),
}


def run_data_loader(args, world):
    n, spec = args.pop("n"), args.pop("dataset")
    sampler = args.pop("sampler")
    if mark(sampler) == "@balancer":
        sampler = bno.Balancer(world.comm, bno.make_strategy("equal", 1, 4), n)
    if mark(args.get("generator")) == "@generator":
        args["generator"] = torch.Generator()
    if mark(args.get("collate_fn")) == "@collate":
        args["collate_fn"] = list
    loader = bno.DataLoader(dataset(spec, n), sampler=sampler, **args)
    if args.get("num_workers", 0) == 0:  # no worker processes here: take the first batch
        next(iter(loader))
        step = sampler.current_step
        assert step is not None and step.size == step.batch_sizes[0] == len(step.keys)
    return loader
