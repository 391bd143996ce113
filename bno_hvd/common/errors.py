"""How a run reports what went wrong: two exception types and one channel for warnings.

Library code raises :class:`UsageError` with a single-line, fix-it message; the CLI turns it
into one line on stderr and exit code 2 (never a traceback). :class:`TrainingError` is a run
that cannot go on (a non-finite loss): one line, exit code 1.

Most errors are *collective*: every rank reaches the same conclusion (the ranks agree on bad
flags before the first collective; every rank sees the same global loss), so rank 0 alone
prints. An error found by one rank alone in the middle of training (an unreadable image in its
slice) carries ``rank``: that rank prints it, and the job is aborted so that no rank waits in a
collective for it.

:class:`WarningLog` is the one place warnings go: each distinct message once, printed by the
loop on rank 0.
"""

from __future__ import annotations


class UsageError(ValueError):
    """A user error: bad flag, bad file, bad shape. ``str(err)`` is one line that says how to fix it.

    Args:
        message: the one line.
        rank: the rank that alone found it (None: every rank did, and rank 0 reports it).

    Example::

        try:
            bno.make_strategy("balanced", 4, 0)
        except bno.UsageError as err:
            print(err)       # base batch size (--base-batch-size) must be an integer >= 1, got 0
    """

    exit_code = 2

    def __init__(self, message: str, *, rank: int | None = None):
        super().__init__(message)
        self.rank = rank  # set when only this rank knows (see the module doc)


def import_horovod():
    """``horovod.torch``, or a :class:`UsageError` saying how to install it: Horovod is an optional
    dependency (``pip install bno-hvd[horovod]``), as it is built against the local PyTorch and MPI."""
    try:
        import horovod.torch as hvd
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("horovod"):
            raise
        raise UsageError(
            "Horovod is not installed: install bno-hvd[horovod] (Horovod built with PyTorch and MPI)"
        ) from None
    except ImportError as err:
        raise UsageError(
            f"Horovod cannot be used with this PyTorch ({str(err).splitlines()[0]}): "
            "reinstall it built with HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1"
        ) from None
    return hvd


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss, or a broken internal check: a bug in bno-hvd);
    the message is one line. Raised on every rank; uncaught in a script that uses a drop-in, rank 0
    prints it as one ``bno-hvd: error:`` line and the job exits with 1.

    Example::

        try:
            train(model, optimizer, train_loader)
        except bno.TrainingError as err:
            print(f"stopped: {err}")

    Args:
        message: the one line.
        rank: the rank that alone found it, and prints it (None: every rank did; rank 0 prints it).
    """

    exit_code = 1

    def __init__(self, message: str, *, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


def check_invariant(holds: bool, what: str) -> None:
    """Raise :class:`TrainingError` unless ``holds``: a result bno-hvd computed broke its own
    rule (``what``), a bug rather than a user's error; an ``assert`` would vanish under -O and
    end a rank with an empty AssertionError."""
    if not holds:
        raise TrainingError(f"internal check failed: {what}; this is a bug in bno-hvd, please report it")


class WarningLog:
    """Distinct warnings, each reported once: ``warn`` adds, ``drain`` hands out what is new."""

    def __init__(self):
        self._seen: set[str] = set()
        self._new: list[str] = []

    def warn(self, message: str | None) -> None:
        if message and message not in self._seen:
            self._seen.add(message)
            self._new.append(message)

    def drain(self) -> list[str]:
        new, self._new = self._new, []
        return new

    def __contains__(self, message: str) -> bool:
        return message in self._seen
