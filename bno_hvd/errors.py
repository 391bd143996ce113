"""The exception types a run ends with.

Library code raises :class:`UsageError` with a single-line, fix-it message; the CLI turns it
into one line on stderr and exit code 2 (never a traceback). :class:`TrainingError` is a run
that cannot go on (a non-finite loss): one line, exit code 1.
"""


class UsageError(ValueError):
    """A user error: bad flag, bad file, bad shape. ``str(err)`` is one line that says how to fix it."""

    exit_code = 2


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss); the message is one line. Raised on every rank."""

    exit_code = 1
