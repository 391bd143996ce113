"""The model side of the public API as fuzz surfaces (see :mod:`support.fuzz_api`):
``bno_hvd.DistributedOptimizer`` and ``exact_dropout``, with their argument tables and runs."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from support.fuzz_api import JUNK, arg, mark, optional, strategy_for
from torch import nn

import bno_hvd as bno

# -- bno.DistributedOptimizer ----------------------------------------------------------------------

OPTIMIZER = {
    "optimizer": arg(("@sgd", "@adam"), ("@wrapped", *JUNK)),
    "named_parameters": arg(("@named", None), ("@duplicates", "@partial", "@plain", *JUNK)),
    "balancer": arg(("equal", "random", "bno"), JUNK),
    "step": arg((False, True)),
    "op": optional(("@Average", "@Sum", None), ("@Adasum", "@Min", "@Max", -1, 9, *JUNK)),
    "gradient_predivide_factor": optional((1.0,)),
    "lr_scaling": optional(("linear", "none")),
    "backward_passes_per_step": optional((1, 2)),
    "compression": optional(("@none", "@fp16")),
    "groups": optional((None, 1, 2, "@params"), (0, -1, *JUNK)),
    "sparse_as_dense": optional((False, True)),
    "num_groups": optional((), (0, 2, *JUNK)),
    "bogus_option": optional(()),
}


def run_optimizer(args, world):
    hvd = world.hvd
    model = nn.Linear(3, 1).double()
    params = list(model.named_parameters())
    optimizer = args.pop("optimizer")
    if mark(optimizer) in ("@sgd", "@adam", "@wrapped"):
        kind = torch.optim.Adam if optimizer == "@adam" else torch.optim.SGD
        wrap = optimizer == "@wrapped"
        optimizer = kind(model.parameters(), lr=0.1)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=params) if wrap else optimizer
    named = args.pop("named_parameters")
    fresh = {"@named": params, "@duplicates": [("w", p) for _, p in params], "@partial": params[:1]}
    named = [p for _, p in params] if mark(named) == "@plain" else fresh.get(mark(named), named)
    balancer, step = strategy_for(args.pop("balancer")), args.pop("step")
    if isinstance(balancer, bno.Strategy):
        balancer = bno.Balancer(world.comm, balancer, 20)
    for key, where in (("op", hvd), ("compression", hvd.Compression)):
        if isinstance(args.get(key), str) and args[key].startswith("@"):
            args[key] = getattr(where, args[key][1:])
    if mark(args.get("groups")) == "@params":
        args["groups"] = [[p for _, p in params]]
    opt = bno.DistributedOptimizer(optimizer, named, balancer=balancer, **args)
    if step:  # one update through the balancer's loader
        data = torch.utils.data.TensorDataset(torch.ones(20, 3, dtype=torch.float64), torch.ones(20))
        x, t = next(iter(bno.DataLoader(data, sampler=balancer, seed_samples=False)))
        opt.zero_grad()
        for _ in range(args.get("backward_passes_per_step", 1)):
            F.mse_loss(model(x).reshape(-1), t.double()).backward()
        opt.step()
        assert balancer.update == 1 and all(torch.isfinite(p).all() for p in model.parameters())
    return opt


# -- bno.exact_dropout -----------------------------------------------------------------------------


class Dropping(nn.Module):
    """A model whose forward drops out as drawn: a Dropout module, F.dropout* with ``p``, or alpha."""

    def __init__(self, kind, p):
        super().__init__()
        self.kind, self.p = kind, p
        self.module = {"module": nn.Dropout(0.5), "module2d": nn.Dropout2d(0.5)}.get(kind)

    def forward(self, x):
        if self.module is not None:
            return self.module(x)
        f = {"dropout": F.dropout, "dropout1d": F.dropout1d, "dropout2d": F.dropout2d, "alpha": F.alpha_dropout}
        return f[self.kind](x, p=self.p, training=self.training)


KINDS = ("module", "dropout", "dropout1d", "dropout2d", "module2d")
DIMS = {"dropout1d": (2, 3), "dropout2d": (4,), "module2d": (4,)}  # what plain torch takes without a warning
DROPOUT = {
    "model": arg(KINDS, ("alpha", *JUNK)),
    "p": arg((0.5, 0.0, 1.0, 0.1, 0.9), (-0.1, 1.5, math.nan, "0.5", None)),
    "balancer": arg(("@balancer",)),
    "rows": arg(("batch",), (0, 1, 3, 9)),
    "dims": arg((2, 3, 4), (1,)),
    "in_step": arg((True, False), (True, False)),
    "training": arg((True, False), (True, False)),  # model.train(), torch's own call
}


def run_exact_dropout(args, world):
    kind = args["model"]
    model = kind
    if isinstance(kind, str) and kind in (*KINDS, "alpha"):
        # a p torch refuses outside training is the model's own error: bno-hvd is not involved there
        model = Dropping(kind, args["p"] if args["training"] else 0.5)
    balancer = args["balancer"]
    if mark(balancer) == "@balancer":
        balancer = bno.Balancer(world.comm, bno.make_strategy("equal", 1, 4), 16)
    wrapped = bno.exact_dropout(model, balancer)
    wrapped.train(args["training"])
    rows = 4
    if args["in_step"]:
        rows = len(next(iter(bno.DataLoader(list(range(16)), sampler=balancer, seed_samples=False))))
    rows = rows if args["rows"] == "batch" else args["rows"]
    allowed = DIMS.get(kind, (1, 2, 3, 4)) if isinstance(kind, str) else (1, 2, 3, 4)
    dims = min(max(args["dims"], allowed[0]), allowed[-1])
    x = torch.ones((rows, 4, 3, 2)[:dims], dtype=torch.float64)
    out = wrapped(x)
    assert out.shape == x.shape and torch.isfinite(out).all()
    return out
