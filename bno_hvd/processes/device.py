"""Where a rank computes: the CPU, or one GPU per local rank; and mixed precision.

``--device auto`` takes GPU ``local_rank`` when CUDA is available (one rank per GPU, as Horovod
pins them) and the CPU otherwise; ``cpu`` and ``cuda`` ask for one explicitly. On a GPU the
model and every batch live there (pinned host memory, non-blocking copies), memory metrics come
from ``torch.cuda`` (NVML if that fails), and the compute phase ends with a
``torch.cuda.synchronize()`` so that the measured step time is the GPU's, not the launch time.

``--amp``: autocast in the forward pass (float16 on a GPU, with a ``GradScaler`` used inside
Horovod's ``synchronize()``/``skip_synchronize()`` as Horovod's own examples do; bfloat16 on
the CPU, which needs no scaling).

Usage::

    device = select_device("auto", torch.cuda.is_available(), torch.cuda.device_count(), local_rank)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from bno_hvd.common.errors import UsageError

CHOICES = ("auto", "cpu", "cuda")


def select_device(requested: str, cuda_available: bool, device_count: int, local_rank: int) -> str:
    """The torch device string for this rank (pure: the caller passes what the machine has)."""
    if requested not in CHOICES:
        raise UsageError(f"--device {requested!r}: use one of {', '.join(CHOICES)}")
    if requested == "cpu" or (requested == "auto" and not (cuda_available and device_count > 0)):
        return "cpu"
    if not cuda_available or device_count < 1:
        raise UsageError(
            "--device cuda: no CUDA device here (torch.cuda.is_available() is False); use --device cpu or auto"
        )
    if local_rank >= device_count:
        raise UsageError(
            f"--device {requested}: this host has {device_count} GPU(s) but runs a rank with local "
            f"rank {local_rank}; start at most {device_count} ranks per host (one per GPU)"
        )
    return f"cuda:{local_rank}"


@dataclass
class Device:
    """One rank's device and precision settings."""

    name: str  # "cpu" or "cuda:N"
    amp: bool = False

    @classmethod
    def for_rank(cls, requested: str, local_rank: int, amp: bool = False) -> Device:
        name = select_device(requested, torch.cuda.is_available(), torch.cuda.device_count(), local_rank)
        if name.startswith("cuda"):
            torch.cuda.set_device(torch.device(name))
        return cls(name, amp)

    @property
    def is_cuda(self) -> bool:
        return self.name.startswith("cuda")

    @property
    def torch(self) -> torch.device:
        return torch.device(self.name)

    def synchronize(self) -> None:
        """Wait for the device's queued work (a no-op on the CPU), so a clock read after it is real."""
        if self.is_cuda:
            torch.cuda.synchronize(self.torch)

    def autocast(self):
        """The forward pass's precision context (a no-op without ``amp``)."""
        if not self.amp:
            return contextlib.nullcontext()
        if self.is_cuda:
            return torch.autocast("cuda", dtype=torch.float16)
        return torch.autocast("cpu", dtype=torch.bfloat16)

    def grad_scaler(self):
        """A GradScaler for float16 on a GPU; None where no scaling is needed."""
        return torch.amp.GradScaler("cuda") if self.amp and self.is_cuda else None


def measure_cap(model, input_shape, device: Device, batch: int = 16, num_classes: int = 10) -> int:
    """The memory cap of this GPU for ``model``: one training pass of ``batch`` random samples,
    its peak memory above the model's, and :func:`derive_cap` over the device's total memory."""
    import torch.nn.functional as F

    if not device.is_cuda:
        raise UsageError("--max-batch auto measures GPU memory; on the CPU give the caps as numbers")
    dev = device.torch
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    x = torch.randn(batch, *input_shape, device=dev, dtype=next(model.parameters()).dtype)
    y = torch.randint(0, num_classes, (batch,), device=dev)
    with device.autocast():
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev)
    return derive_cap(peak, base, batch, torch.cuda.get_device_properties(dev).total_memory)


def derive_cap(peak_bytes: float, base_bytes: float, batch: int, budget_bytes: float, headroom: float = 0.9) -> int:
    """A memory cap in samples per pass: what fits in ``headroom`` of ``budget_bytes``, given that a
    pass of ``batch`` samples peaked at ``peak_bytes`` over ``base_bytes`` (model, optimizer state).

    Usage (on a GPU, after one training step of ``batch`` samples)::

        derive_cap(torch.cuda.max_memory_allocated(), base, batch, torch.cuda.get_device_properties(0).total_memory)
    """
    per_sample = (peak_bytes - base_bytes) / max(1, batch)
    if not per_sample > 0:
        raise UsageError("cannot derive a memory cap: the measured step used no memory beyond the model")
    free = headroom * budget_bytes - base_bytes
    if free < per_sample:
        raise UsageError(
            f"the model alone leaves room for no sample on this device ({base_bytes / 2**30:.1f} GiB "
            f"of {budget_bytes / 2**30:.1f} GiB used); use a smaller model or a larger device"
        )
    return int(free // per_sample)
