"""THE FRAMEWORK ADAPTERS: bno-hvd where users train today, each a thin room over the DDP drop-in
(the Balancer as sampler, the weighting communication hook, ``bno.exact``), so that a framework's
version change touches one file. Each module imports its framework on import and says in one line
what to install when it is missing; ``bno_hvd`` loads them on first use (``bno.lightning``,
``bno.accelerate``, ``bno.hf``). May import what :mod:`bno_hvd.library` may, and the library.

- :mod:`.lightning` - PyTorch Lightning 2.x: a strategy named in one place (``bno.lightning``)
- :mod:`.lightning_sitout` - a rank given 0 samples sits the update out inside Lightning's loop
- :mod:`.accelerate` - Hugging Face Accelerate 1.x: a script built on ``accelerator.prepare`` (``bno.accelerate``)
- :mod:`.trainer` - the Hugging Face ``Trainer`` (transformers 5.x), batches split by token cost (``bno.hf``)
"""

import contextlib

from bno_hvd.common.errors import UsageError


def missing_extra(what: str, extra: str, err: ImportError):
    """Raise the one line a framework module gives when its framework is not installed (at import,
    before any drop-in constructor has made errors one line: so it does that first)."""
    from bno_hvd.processes.world import one_line_errors

    one_line_errors()
    raise UsageError(f"{what}: pip install 'bno-hvd[{extra}]' ({err})") from None


@contextlib.contextmanager
def refused_alike(seconds: float = 60.0):
    """A :class:`UsageError` raised inside, which every process finds alike before training's first
    collective, waits (at most ``seconds``) until every process has arrived here: none exits while
    another still connects its Gloo mesh, which then fails with a traceback (the CI of 576caa4)."""
    try:
        yield
    except UsageError:
        all_arrived(seconds)
        raise


def all_arrived(seconds: float = 60.0) -> None:
    """Wait (at most ``seconds``) until every process has reached this point; best effort."""
    import datetime

    import torch.distributed as dist

    try:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=seconds))
    except Exception:  # noqa: BLE001 - a process that did not come: the error is raised anyway
        pass
