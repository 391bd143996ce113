"""The one exception type for user mistakes.

Library code raises :class:`UsageError` with a single-line, fix-it message; the CLI turns it
into one line on stderr and exit code 2 (never a traceback).
"""


class UsageError(ValueError):
    """A user error: bad flag, bad file, bad shape. ``str(err)`` is one line that says how to fix it."""

    exit_code = 2
