"""The property every user-input surface is held to (issue 15), and the CLI's form of it.

``result_or_one_line(call)``: the call returns a result, or raises :class:`UsageError` whose
message is one line; nothing else. No other exception, no warning (a numpy overflow warning
reaches a user's stderr), no hang (an alarm ends an example after :data:`TIME_LIMIT` s, or the surface's own limit).
``cli_result(args)``: ``bno-hvd ARGS`` exits 0, or exits 2 with exactly one ``bno-hvd: error:``
line on stderr and no traceback.
"""

from __future__ import annotations

import gc
import signal
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from bno_hvd.cli.main import main
from bno_hvd.common import parsing
from bno_hvd.common.errors import UsageError

TIME_LIMIT = 20.0  # seconds one example may take before it counts as a hang
MAX_MESSAGE = 2000  # characters: one line a user can read, not a dumped file


class Hang(BaseException):
    """Raised by the alarm; a BaseException so that no ``except Exception`` in the code under test hides it."""


def _runqueue_wait() -> float:
    """Seconds this process has waited, runnable, for a CPU (Linux's schedstat; 0 where it is missing)."""
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


@contextmanager
def time_limit(seconds: float):
    """Raise :class:`Hang` once the block has run ``seconds``, not counting time it waited, runnable, for a
    CPU: a test at idle priority beside busy processes can be starved for longer than that, which is no hang."""
    start, waited = time.monotonic(), _runqueue_wait()

    def alarm(signum, frame):
        used = time.monotonic() - start - (_runqueue_wait() - waited)
        if used < seconds:
            signal.setitimer(signal.ITIMER_REAL, seconds - used)  # starved meanwhile: the rest of the limit
            return
        raise Hang()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_COLLECTED = [0.0]  # when result_or_one_line last collected garbage


def assert_one_line(message: str) -> None:
    assert message.strip(), "empty error message"
    assert message.splitlines() == [message], f"error message is not one line: {message!r}"
    assert len(message) <= MAX_MESSAGE, f"error message of {len(message)} characters: {message[:200]!r}..."


def result_or_one_line(call: Callable[[], Any], limit: float = TIME_LIMIT):
    """``call()``'s result, or None after a one-line UsageError; anything else fails the example, and so
    does running longer than ``limit`` seconds."""
    if time.monotonic() - _COLLECTED[0] > 5:  # once a test, not per example (a full collection is slow)
        gc.collect()  # earlier tests' garbage (a Popen in a traceback's cycle) warns now, not inside the call
        _COLLECTED[0] = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with time_limit(limit):
                result = call()
        except UsageError as err:
            assert_one_line(str(err))
            result = None
        except Hang:
            raise AssertionError(f"no answer within {limit:g} s (a hang)") from None
    assert not caught, "warnings escaped: " + "; ".join(
        f"{w.category.__name__} at {w.filename}:{w.lineno}: {w.message}" for w in caught
    )
    return result


def cli_result(args: list[str], *, ok_output: Callable[[str], None] | None = None):
    """Run ``bno-hvd ARGS`` in-process: ``ok_output(stdout)`` on success, else one error line and exit 2."""
    result = CliRunner().invoke(main, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code == 0:
        if ok_output is not None:
            ok_output(result.stdout)
        return result
    assert_cli_error(result.exit_code, result.stdout, result.stderr)
    return None


def assert_cli_error(code: int, stdout: str, stderr: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, f"exit {code}\nSTDOUT:\n{stdout[-2000:]}\nSTDERR:\n{stderr[-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("bno-hvd: error: "), stderr[-3000:]
    assert_one_line(lines[0])
    assert "Traceback" not in stdout + stderr


def write_file(directory: Path, spec: dict) -> Path:
    """Write a generated file (``{"name", "content"}``) into ``directory``; its path."""
    path = directory / spec["name"]
    path.write_bytes(spec["content"])
    return path


def in_range(values, bounds: parsing.Range) -> bool:
    """Every value (text or number) inside ``bounds``."""
    return all(bounds.contains(float(v)) for v in values)
