"""Hugging Face Accelerate 1.x: a script built on ``accelerator.prepare(model, optimizer, train_loader)``
trains on uneven, rebalanced batches (docs/accelerate.md).

Five lines change in an Accelerate script (``examples/accelerate_mnist.py`` has the whole port)::

    import bno_hvd as bno
    accelerator = bno.accelerate.Accelerator(cpu=args.cpu)                  # was Accelerator(cpu=args.cpu)
    train_sampler = bno.Balancer.for_world(train_set, args.batch_size)      # added
    train_loader = bno.DataLoader(train_set, sampler=train_sampler)         # was DataLoader(..., shuffle=True)
    model = bno.exact(Net(), train_sampler)                                 # was model = Net()

and ``model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)`` and the
loop (``accelerator.backward(loss)``, ``optimizer.step()``) stay. What :class:`Accelerator` does
differently from Accelerate's own, and only where ``prepare`` is handed the balancer's loader:

- the loader is not sharded (Accelerate's ``DataLoaderShard`` cuts one sampler's batches into even
  parts; the Balancer already gives each rank its slice): ``prepare`` only moves its batches to
  the accelerator's device;
- the model is wrapped in torch's DDP by Accelerate as always, then given the DDP drop-in's
  weighting hook (:func:`bno_hvd.library.ddp.balance_ddp`): each rank's gradient is weighted by
  its share of the global batch, so the update is one process's on the whole global batch;
- what would not be exact is refused in one line: gradient accumulation (``accumulate`` skips
  the allreduce of all but the last micro-batch, which the weights of a rebalancing split do not
  follow), DeepSpeed, FSDP, Megatron-LM, XLA, tensor/context parallelism, a comm hook of
  Accelerate's own (the weighting hook owns the reduction), and a model prepared for training
  apart from the balancer's loader.
"""

from __future__ import annotations

try:
    import accelerate
    from accelerate.utils import send_to_device
except ImportError as err:  # pragma: no cover - the extra is not installed
    from bno_hvd.library.frameworks import missing_extra

    missing_extra("bno.accelerate needs Hugging Face Accelerate", "accelerate", err)

from bno_hvd.common.errors import UsageError
from bno_hvd.library.ddp import balance_ddp
from bno_hvd.library.dropin import DataLoader
from bno_hvd.library.frameworks import all_arrived, refused_alike
from bno_hvd.processes.world import one_line_errors

__all__ = ["Accelerator"]

# accelerate.utils.DistributedType's members where Accelerate trains by DDP (or in one process): the
# weighting hook works there
DDP_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_XPU", "MULTI_MLU", "MULTI_MUSA", "MULTI_HPU")


class Accelerator(accelerate.Accelerator):
    """``accelerate.Accelerator`` for uneven batches: ``prepare`` takes the balancer's loader
    (:class:`bno_hvd.DataLoader`) as Accelerate's own takes a torch DataLoader, and the model
    prepared with it gets the weighted gradients of the DDP drop-in. Takes Accelerate's arguments;
    everything else (the evaluation loader, ``gather``, ``save_state``, mixed precision) is
    Accelerate's.

    Args:
        *args, **kwargs: ``accelerate.Accelerator``'s (``cpu``, ``mixed_precision``,
            ``kwargs_handlers``, ...); ``gradient_accumulation_steps`` must stay 1.

    Example::

        accelerator = bno.accelerate.Accelerator(cpu=True)          # under torchrun
        train_sampler = bno.Balancer.for_world(train_set, 64, rebalance_every=10)
        train_loader = bno.DataLoader(train_set, sampler=train_sampler)
        model = bno.exact(Net(), train_sampler)
        model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
        for images, labels in train_loader:                         # this rank's slice of each global batch
            optimizer.zero_grad()
            accelerator.backward(F.nll_loss(model(images), labels))  # the mean over the global batch
            optimizer.step()
    """

    def __init__(self, *args, **kwargs):
        one_line_errors()
        super().__init__(*args, **kwargs)
        self.balancer = None

    def prepare(self, *args, device_placement=None):
        """Accelerate's ``prepare``; a :class:`bno_hvd.DataLoader` among ``args`` is kept as the
        balancer's loader (on this accelerator's device) and the models prepared with it weighted."""
        with refused_alike():
            for loader in (a for a in args if isinstance(a, DataLoader)):
                if self.balancer is not None and loader.balancer is not self.balancer:
                    raise UsageError("prepare() got the loaders of two balancers: train from one Balancer")
                self.balancer = loader.balancer
            if self.balancer is not None:
                refuse_unsupported(self)
        result = super().prepare(*args, device_placement=device_placement)
        wrapped = tuple(OnDevice(r, self) if isinstance(r, DataLoader) else r for r in _as_tuple(result, len(args)))
        return wrapped[0] if len(args) == 1 else wrapped

    def prepare_model(self, model, device_placement=None, evaluation_mode=False):
        """Accelerate's ``prepare_model``; the DDP model it builds for training gets the weighting
        hook of the balancer (:func:`bno_hvd.library.ddp.balance_ddp`)."""
        if evaluation_mode or getattr(model, "_is_accelerate_prepared", False) or not _trains(model):
            return super().prepare_model(model, device_placement=device_placement, evaluation_mode=evaluation_mode)
        if self.balancer is None:
            if self.num_processes > 1:
                all_arrived()  # every process alike (bno_hvd.library.frameworks.refused_alike)
                raise UsageError(
                    "bno.accelerate.Accelerator prepares a model for training together with the balancer's loader: "
                    "accelerator.prepare(model, optimizer, bno.DataLoader(train_set, sampler=balancer))"
                )
            return super().prepare_model(model, device_placement=device_placement)
        own = self.ddp_handler
        self.ddp_handler = WeightingHandler(own, self.balancer)  # Accelerate calls it on the DDP model it builds
        try:
            return super().prepare_model(model, device_placement=device_placement)
        finally:
            self.ddp_handler = own


class WeightingHandler:
    """Stands in for Accelerate's ``DistributedDataParallelKwargs`` while a model is prepared:
    the DDP options are the user's, and the comm hook Accelerate registers is the weighting one."""

    def __init__(self, own, balancer):
        self.own, self.balancer = own, balancer
        self.options = own.to_kwargs() if own is not None else {}

    def to_kwargs(self) -> dict:
        return dict(self.options)

    def register_comm_hook(self, model) -> None:
        balance_ddp(model, self.balancer, self.options)


class OnDevice:
    """The balancer's loader, its batches moved to the accelerator's device (what Accelerate's
    ``DataLoaderShard`` does for a torch DataLoader). ``len()`` and the other attributes are the loader's."""

    def __init__(self, loader: DataLoader, accelerator):
        self.loader, self.device = loader, accelerator.device
        self.placement, self.non_blocking = accelerator.device_placement, accelerator.non_blocking

    def __iter__(self):
        for batch in self.loader:
            yield send_to_device(batch, self.device, non_blocking=self.non_blocking) if self.placement else batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name):
        return getattr(self.loader, name)


def refuse_unsupported(accelerator) -> None:
    """One line for each thing a balanced Accelerate script cannot do exactly (module docstring)."""
    kind = accelerator.distributed_type
    if kind.name not in DDP_TYPES:
        raise UsageError(
            f"bno.accelerate trains with DDP, not {kind.name}: drop DeepSpeed/FSDP/Megatron-LM/XLA from the "
            "accelerate config (the weighted gradients are a DDP communication hook)"
        )
    if accelerator.gradient_accumulation_steps != 1:
        raise UsageError(
            f"gradient_accumulation_steps={accelerator.gradient_accumulation_steps}: bno.accelerate does not "
            "accumulate gradients; set a larger global batch (Balancer.for_world(..., global_batch=)) instead"
        )
    config = accelerator.parallelism_config
    if config is not None and (config.tp_enabled or config.cp_enabled):
        raise UsageError("bno.accelerate trains with DDP alone: drop tensor/context parallelism (parallelism_config)")
    hook = getattr(getattr(accelerator.ddp_handler, "comm_hook", None), "value", "no")
    if hook != "no":
        raise UsageError(
            f"DistributedDataParallelKwargs(comm_hook={hook!r}): bno.accelerate's weighting hook owns the "
            "gradients' reduction; drop the comm hook"
        )


def _trains(model) -> bool:
    return any(p.requires_grad for p in model.parameters())


def _as_tuple(result, count: int) -> tuple:
    return (result,) if count == 1 else tuple(result)
