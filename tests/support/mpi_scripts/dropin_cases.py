"""The drop-in surface (bno_hvd.DataLoader + bno_hvd.DistributedOptimizer) in a plain Horovod loop.

``grads``: a linear model, loss = mean squared error / 2 over each rank's batch of an uneven,
changing split (``random``, rebalanced every 2 updates). After every ``optimizer.step()`` each
rank's ``p.grad`` (what Horovod reduced) must equal the gradient of the whole global batch,
computed here in closed form from the sample stream: with ``op=hvd.Average``, with ``op=hvd.Sum``
and a summed loss, and with ``backward_passes_per_step=2`` (two passes per rank; a rank of one
sample has an empty pass). One update's ``step()`` is skipped after ``synchronize()`` (what a
GradScaler does on an overflow): the update still ends when the next batch is drawn.
``len(loader)`` must be the number of batches each ``for`` yields.

``refusals``: what cannot be exact, one refusal after another in one job (a job's start-up costs
more than its case): each of :data:`REFUSALS` but the last must raise a one-line ``UsageError``
that every rank raises alike (exit code 2, no rank of its own), which each rank prints; the last
is not caught: it must end the job with one ``bno-hvd: error:`` line.
The other cases end the job as a script would. Several cases run in the order given
(``grads refusals``: one job for both); ``grads`` as the last case exits 1 on a failure.
"""

import sys
import time

import horovod.torch as hvd
import torch
from torch.utils.data import TensorDataset

import bno_hvd as bno
from bno_hvd.allocation.sampler import UnevenSampler
from bno_hvd.common.errors import UsageError

N, B, SEED = 50, 4, 3
REFUSALS = ["adasum", "predivide", "torch-loader", "memory-cap", "foreign-loader"]


def say(line: str) -> None:
    """One write per line: mpirun's rank tags cannot land between a line and its newline."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def data():
    i = torch.arange(N, dtype=torch.float64)
    x = torch.stack([torch.sin(i), torch.cos(3 * i), i / N], 1)
    return TensorDataset(x, 2 * x[:, 0] - x[:, 1] + 0.5 * x[:, 2] + 0.1 * torch.sin(7 * i))


def expected_grad(w, x, t, reduction):
    residual = x @ w - t
    g = residual @ x  # d/dw of sum((xw - t)^2) / 2
    return g / len(t) if reduction == "mean" else g


def run_grads(op_name, passes, dataset):
    bal = bno.Balancer.for_world(dataset, B, "random", seed=SEED, rebalance_every=2)
    loader = bno.DataLoader(dataset, sampler=bal)
    model = torch.nn.Linear(3, 1, bias=False).double()
    torch.nn.init.constant_(model.weight, 0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    op = {"average": hvd.Average, "sum": hvd.Sum}[op_name]
    opt = bno.DistributedOptimizer(
        opt, balancer=bal, named_parameters=model.named_parameters(), op=op, backward_passes_per_step=passes
    )
    reduction = "mean" if op_name == "average" else "sum"
    stream = UnevenSampler(N, seed=SEED)  # the global batches, computed here independently
    failures, batches, sizes_seen = [], 0, set()
    for epoch in range(2):
        length = len(loader)
        yielded = 0
        for x, t in loader:
            yielded += 1
            sizes = bal.current_step.batch_sizes
            sizes_seen.add(tuple(sizes))
            idx = stream.global_batch(sum(sizes))
            stream.advance(sum(sizes))
            w = model.weight.detach().reshape(-1).clone()
            want = expected_grad(w, dataset.tensors[0][idx], dataset.tensors[1][idx], reduction)
            opt.zero_grad()
            n = len(t)
            for part in (slice(0, n // 2), slice(n // 2, n)) if passes == 2 else (slice(0, n),):
                residual = (model(x[part]).reshape(-1) - t[part]) ** 2 / 2
                loss = residual.sum() / n if reduction == "mean" else residual.sum()
                loss.backward()
            if batches == 3:  # a GradScaler's skipped step: reduce, do not step
                opt.synchronize()
                got = model.weight.grad.reshape(-1)
            else:
                opt.step()
                got = model.weight.grad.reshape(-1)
            if not torch.allclose(got, want, rtol=1e-12, atol=1e-12):
                failures.append(f"batch {batches}: got {got.tolist()} want {want.tolist()}")
            batches += 1
            if len(loader) != length:
                failures.append(f"len(loader) changed from {length} to {len(loader)} during the epoch")
        if yielded != length:
            failures.append(f"epoch {epoch}: len(loader) was {length} but the for yielded {yielded}")
    bal.finish_step()
    if bal.update != batches:
        failures.append(f"{batches} batches but the balancer counted {bal.update} updates")
    if len(sizes_seen) < 2 or all(len(set(s)) == 1 for s in sizes_seen):
        failures.append(f"the split never was uneven and changing: {sorted(sizes_seen)}")
    if len(bal) != -(-N * bal.plan.latest()[hvd.rank()] // sum(bal.plan.latest())):
        failures.append(f"len(balancer) {len(bal)}")
    return failures


def run_batches_and_lr(dataset):
    """``bno`` changes the global batch: each step runs at lr * G_t / G (seen in SGD's update),
    the param group keeps the user's lr; ``batches(loader, updates=N)`` stops at N, mid-epoch."""
    bal = bno.Balancer.for_world(dataset, B, "bno", seed=SEED, rebalance_every=2)
    loader = bno.DataLoader(dataset, sampler=bal)
    model = torch.nn.Linear(3, 1, bias=False).double()
    opt = bno.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), balancer=bal)
    failures, seen = [], 0
    for stop in (7, 10):  # 10 updates of 16 samples: the second call continues mid-epoch
        for x, t in bal.batches(loader, updates=stop):
            seen += 1
            factor = bal.current_step.global_batch / bal.strategy.global_batch
            before = model.weight.detach().clone()
            opt.zero_grad()
            ((model(x).reshape(-1) - t) ** 2).mean().backward()
            opt.step()
            grad, moved = model.weight.grad, model.weight.detach() - before
            i = grad.abs().argmax()
            lr = (-moved.reshape(-1)[i] / grad.reshape(-1)[i]).item()
            if abs(lr - 0.1 * factor) > 1e-9 or opt.param_groups[0]["lr"] != 0.1:
                failures.append(f"lr used {lr}, want {0.1 * factor}; group lr {opt.param_groups[0]['lr']}")
        if bal.update != stop or seen != stop:
            failures.append(f"batches(updates={stop}) ended at update {bal.update} after {seen} batches")
    # what replaces Horovod's lr * hvd.size(): the global batch over B
    wide = bno.Balancer.for_world(dataset, B, "balanced", global_batch=6 * hvd.size())
    scales = (bal.lr_scale(), wide.lr_scale(), wide.lr_scale("none"))
    if scales != (hvd.size(), 1.5 * hvd.size(), 1.0):
        failures.append(f"lr_scale() gave {scales}")
    return failures


def run_adasum_on_even_batches(dataset):
    """Adasum is accepted where batches are always even (``equal``), and steps."""
    bal = bno.Balancer.for_world(dataset, B, "equal", seed=SEED)
    model = torch.nn.Linear(3, 1, bias=False).double()
    opt = bno.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), balancer=bal, named_parameters=model.named_parameters(),
        op=hvd.Adasum,
    )  # fmt: skip
    for x, t in bal.batches(bno.DataLoader(dataset, sampler=bal), updates=3):
        opt.zero_grad()
        ((model(x).reshape(-1) - t) ** 2).mean().backward()
        opt.step()
    return [] if bal.update == 3 and torch.isfinite(model.weight).all() else [f"adasum: {bal.update} updates"]


def refuse(case, dataset):
    """Do what ``case`` names, which bno-hvd must refuse."""
    bal = bno.Balancer.for_world(dataset, B, "balanced", seed=SEED)
    model = torch.nn.Linear(3, 1, bias=False).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if case == "adasum":
        bno.DistributedOptimizer(opt, balancer=bal, op=hvd.Adasum)
    elif case == "predivide":
        bno.DistributedOptimizer(opt, balancer=bal, gradient_predivide_factor=2.0)
    elif case == "torch-loader":  # the balancer handed to torch's DataLoader as its sampler
        for _batch in torch.utils.data.DataLoader(dataset, batch_size=B, sampler=bal):
            pass
    elif case == "memory-cap":  # micro-batches, which the script's own loop does not run
        bno.DataLoader(dataset, sampler=bno.Balancer.for_world(dataset, B, "balanced", seed=SEED, max_batch=2))
    elif case == "foreign-loader":  # the drop-in optimizer fed by a loader the balancer did not make
        sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
        opt = bno.DistributedOptimizer(opt, balancer=bal, named_parameters=model.named_parameters())
        for x, t in torch.utils.data.DataLoader(dataset, batch_size=B, sampler=sampler):
            opt.zero_grad()
            ((model(x).reshape(-1) - t) ** 2).mean().backward()
            opt.step()
    say(f"rank {hvd.rank()}: case {case} was not refused")


def main(cases):
    hvd.init()
    torch.set_num_threads(1)
    dataset = data()
    for case in cases:
        run_case(case, dataset, last=case == cases[-1])


def run_case(case, dataset, last):
    if case == "refusals":
        for name in REFUSALS[:-1]:
            try:
                refuse(name, dataset)
            except UsageError as err:
                alike = err.exit_code == 2 and err.rank is None and "\n" not in str(err)
                say(f"rank {hvd.rank()}: {name} refused{'' if alike else ' NOT alike'}: {err}")
        refuse(REFUSALS[-1], dataset)  # not caught: the job's end is the script's
        return
    if case == "grads":
        failures = []
        for op_name, passes in (("average", 1), ("sum", 1), ("average", 2)):
            found = run_grads(op_name, passes, dataset)
            failures += found
            say(f"rank {hvd.rank()}: op={op_name} passes={passes}: {'ok' if not found else found}")
        for name, check in (("batches+lr", run_batches_and_lr), ("adasum-even", run_adasum_on_even_batches)):
            found = check(dataset)
            failures += found
            say(f"rank {hvd.rank()}: {name}: {'ok' if not found else found}")
        if last:
            sys.exit(1 if failures else 0)
        return
    bal = bno.Balancer.for_world(dataset, B, "balanced", seed=SEED)
    if case == "note":  # for_world's note on shared cores, then a normal end
        print(f"rank {hvd.rank()}: balancer for {len(dataset)} samples, {len(bal)} of them here", flush=True)
        return
    if case == "late":  # rank 0 ends at once; rank 1 still talks MPI on the balancer's comm 3 s later
        if hvd.rank() == 1:
            time.sleep(3)
            print(f"rank 1: late, {bal.control.plane.comm.Get_size()} ranks", flush=True)
        return
    if case == "crash":  # rank 1 dies of an uncaught exception while rank 0 waits in an allreduce
        if hvd.rank() == 1:
            print(f"rank 1: raising at {time.time()}", flush=True)
            raise RuntimeError("rank 1 fails")
        hvd.allreduce(torch.ones(1), name="never-joined")
        return
    raise SystemExit(f"unknown case {case}")


if __name__ == "__main__":
    main(sys.argv[1:])
