"""Parsers of what a user types or points bno-hvd at: list flags, JSON files, per-rank schedules.

Every function returns a valid value or raises :class:`UsageError` with one line that names the
flag or file and says what would be accepted, including the range of values that can really be
run (a speed of 1e-300 parses as a number but would make a rank wait for ever). Nothing else
escapes: not a ``RecursionError`` from deeply nested JSON, not a ``UnicodeDecodeError`` from a
binary file, not a numpy overflow warning. ``tests/cli/test_fuzz_inputs.py`` holds them to that with
Hypothesis.

Usage::

    parse_int_list("5,11,3,13", "--batch-sizes")               # (5, 11, 3, 13)
    parse_float_list("1,1,1,0.33", "--emulate-speed", SPEED)    # [1.0, 1.0, 1.0, 0.33]
    schedule = load_rank_schedule("neighbour.json", "--emulate-schedule", "speeds", SPEED, n_ranks=4)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from bno_hvd.common.errors import UsageError

MAX_FILE_BYTES = 256 * 2**20  # JSON inputs larger than this are refused before parsing
MAX_LIST = 65536  # entries of a comma-separated per-rank list


@dataclass(frozen=True)
class Range:
    """Closed range of values a run can use, with the word for one value in messages."""

    low: float
    high: float
    what: str

    def contains(self, x: float) -> bool:
        x = as_float(x)
        return math.isfinite(x) and self.low <= x <= self.high

    def describe(self) -> str:
        return f"between {_number(self.low)} and {_number(self.high)}"


# What can really be run (see the module doc); one place, used by every flag and file.
SPEED = Range(0.01, 100.0, "speed")  # relative device speed (emulation)
QUOTA = Range(0.01, 64.0, "quota")  # share of one CPU core (cgroup quota)
BATCH = Range(1, 1_000_000, "batch size")  # samples per rank and update
CAP = Range(1, 1_000_000, "cap")  # samples per forward/backward pass
SLOTS = Range(1, 4096, "slot count")  # processes per host
UPDATE = Range(0, 10**9, "update")  # an update index in a schedule
RANKS = Range(1, MAX_LIST, "rank count")  # processes in one job
IMAGE_SIDE = Range(1, 4096, "image side")  # pixels of a square training crop (imagefolder)
SEED = Range(0, 2**32 - 1, "seed")  # what numpy's and torch's generators all accept
# Measurements (metrics files, ClusterMetrics.validate): far beyond any real device, and far
# enough inside float64 that sums over 65536 ranks and reciprocals stay finite.
OPS = Range(1e-3, 1e9, "samples/s")  # throughput of one rank (or exactly 0)
MEMORY = Range(0, 1e18, "bytes")  # memory in use on one rank (1e18 B = 1 EB)
LATENCY = Range(0, 60.0, "seconds")  # one measured round trip
STEP_SECONDS = Range(1e-6, 86400.0, "seconds")  # one measured compute phase
CPU_SECONDS = Range(0, 86400.0, "CPU seconds")  # CPU one rank spent in one sync phase
CPU_LIMIT = Range(1e-3, 1e6, "cores")  # a cgroup's CPU limit (quota / period)
CPU_PERIOD = Range(1e-3, 1.0, "seconds")  # its CFS period (cgroup v1 and v2 allow 1 ms to 1 s)


def parse_int_list(text: str | None, flag: str, bounds: Range = BATCH) -> tuple[int, ...] | None:
    """``"5,11,3,13"`` -> ``(5, 11, 3, 13)``, every value within ``bounds``; None stays None."""
    if text is None:
        return None
    items = _split(text, flag)
    try:
        values = tuple(int(x) for x in items)
    except ValueError:
        raise UsageError(f"{flag} {show_quoted(text)}: expected comma-separated integers like 5,11,3,13") from None
    if not values:
        raise UsageError(f"{flag} is empty; give one integer per rank, e.g. 5,11,3,13")
    if any(v < bounds.low for v in values):
        raise UsageError(f"{flag} {show_quoted(text)}: every {bounds.what} must be >= {bounds.low:g}")
    if any(v > bounds.high for v in values):
        raise UsageError(f"{flag} {show_quoted(text)}: every {bounds.what} must be {bounds.describe()}")
    return values


def parse_float_list(
    text: str, flag: str, bounds: Range, n_ranks: int | None = None, example: str = "1,1,1,0.33"
) -> list[float]:
    """``"1,1,1,0.33"`` -> floats within ``bounds``, one per rank when ``n_ranks`` is given."""
    items = _split(text, flag)
    try:
        values = [float(x) for x in items]
    except ValueError:
        raise UsageError(f"{flag} {show_quoted(text)}: expected comma-separated numbers like {example}") from None
    if not values or any(not (v > 0) or not math.isfinite(v) for v in values):
        raise UsageError(
            f"{flag} {show_quoted(text)}: every {bounds.what} must be a finite number > 0, {bounds.describe()}"
        )
    if any(not bounds.contains(v) for v in values):
        raise UsageError(
            f"{flag} {show_quoted(text)}: every {bounds.what} must be a finite number > 0, {bounds.describe()}"
        )
    check_per_rank(flag, len(values), n_ranks)
    return values


def parse_name_list(text: str, flag: str, allowed) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``, every name one of ``allowed``."""
    names = [s.strip() for s in str(text).split(",") if s.strip()]
    bad = [s for s in names if s not in allowed]
    if not names or bad:
        shown = [b[:40] for b in bad[:5]]
        raise UsageError(
            f"{flag} {show_quoted(text)}: unknown {shown or 'empty list'}; choose from {','.join(allowed)}"
        )
    return names


def check_per_rank(flag: str, count: int, n_ranks: int | None) -> None:
    if n_ranks is not None and count != n_ranks:
        raise UsageError(f"{flag} has {count} entries but the job has {n_ranks} ranks; give one per rank")


def read_json(path, what: str):
    """The JSON value in file ``path``; ``what`` names it in messages (a flag or "metrics file")."""
    where = f"{what} {show_path(path)}"
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise UsageError(f"cannot read {where} ({err.strerror or type(err).__name__})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise UsageError(f"{where} is larger than {MAX_FILE_BYTES // 2**20} MiB; is it the right file?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{where} is not UTF-8 text (byte {err.start}); give a JSON file") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{where} is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except RecursionError:
        raise UsageError(f"{where} is JSON nested too deeply to be a bno-hvd file") from None
    except ValueError:  # an integer literal longer than Python converts (sys.get_int_max_str_digits)
        raise UsageError(f"{where} holds a number with thousands of digits; it is not a bno-hvd file") from None


@dataclass(frozen=True)
class RankSchedule:
    """Per-rank values that change at given updates: ``entries[k] = (first update, values)``."""

    entries: tuple[tuple[int, tuple[float, ...]], ...]

    def at(self, update: int) -> tuple[float, ...]:
        """The values in force at ``update``."""
        current = self.entries[0][1]
        for start, values in self.entries:
            if update >= start:
                current = values
        return current

    def changes(self) -> list[int]:
        """Updates at which the values change (after the first entry)."""
        return [start for start, _ in self.entries[1:]]

    @classmethod
    def constant(cls, values) -> RankSchedule:
        return cls(((0, tuple(float(v) for v in values)),))


def load_rank_schedule(path: str, flag: str, key: str, bounds: Range, n_ranks: int) -> RankSchedule:
    """``[{"update": 0, KEY: [...]}, {"update": 200, KEY: [...]}, ...]`` from file ``path``.

    The first entry must be at update 0, updates must be distinct integers, every list must have
    one number per rank within ``bounds``.
    """
    raw = read_json(path, flag)
    where = f"{flag} {show_path(path)}"
    shape = f'a JSON list of {{"update": U, "{key}": [one number per rank]}}'
    if not isinstance(raw, list) or not raw:
        raise UsageError(f"{where}: expected {shape}")
    entries = {}
    for k, entry in enumerate(raw):
        if not isinstance(entry, dict) or set(entry) != {"update", key}:
            raise UsageError(f"{where}: entry {k} needs keys 'update' and '{key}' (and nothing else)")
        update, values = entry["update"], entry[key]
        if isinstance(update, bool) or not isinstance(update, int) or not UPDATE.contains(update):
            raise UsageError(f"{where}: entry {k} 'update' must be an integer {UPDATE.describe()}")
        if update in entries:
            raise UsageError(f"{where}: two entries at update {update}; give each update once")
        if not isinstance(values, list) or not all(_is_number(v) for v in values):
            raise UsageError(f"{where}: entry {k} '{key}' must be a list of numbers, one per rank")
        if not all(bounds.contains(as_float(v)) for v in values):
            raise UsageError(
                f"{where}: entry {k}: every {bounds.what} must be a finite number > 0, {bounds.describe()}"
            )
        check_per_rank(f"{where}: entry {k}", len(values), n_ranks)
        entries[update] = tuple(float(v) for v in values)
    ordered = tuple(sorted(entries.items()))
    if ordered[0][0] != 0:
        raise UsageError(f"{where}: the first entry must be at update 0")
    return RankSchedule(ordered)


def _split(text, flag: str) -> list[str]:
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if len(items) > MAX_LIST:
        raise UsageError(f"{flag}: {len(items)} entries; at most {MAX_LIST} ranks are supported")
    return items


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def as_float(x) -> float:
    """``float(x)`` for a number out of a user's file; an integer too large for a float is inf
    (then refused by every :class:`Range`) instead of an OverflowError."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def show_quoted(text, limit: int = 60) -> str:
    """``repr`` of a user's text, shortened so that a message stays one readable line."""
    text = str(text)
    return repr(text if len(text) <= limit else text[:limit] + "...")


def show_text(text, limit: int = 60) -> str:
    """A user's word (a flag value, a name) for a one-line message: as it is when short and
    printable, else its shortened ``repr``."""
    text = str(text)
    return text if len(text) <= limit and text.isprintable() else show_quoted(text, limit)


def show_path(path) -> str:
    """A path for a one-line message: as it is, or its ``repr`` when it holds a line break or
    another character a terminal would not print (a file name may hold anything but '/' and NUL)."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def show_value(value, limit: int = 40) -> str:
    """A value out of a user's JSON file, for a one-line message, as JSON writes it: short, one
    line, never recursive (``json.dumps`` of a 900-level list would itself overflow the stack)."""
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    if isinstance(value, str):  # json.dumps escapes line breaks and everything non-ASCII
        return json.dumps(value if len(value) <= limit else value[:limit] + "...")
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int) and abs(value) >= 10**limit:
        return f"an integer of more than {limit} digits"
    text = str(value)
    return text if len(text) <= limit and text.isprintable() else show_quoted(text, limit)


def clip(message: str, limit: int = 400) -> str:
    """``message`` (e.g. click's, which repeats the user's value whole) as one line of at most
    about ``limit`` characters: its start and its end, which says what is accepted."""
    one = " ".join(message.split())
    return one if len(one) <= limit else one[: limit - 100] + " ... " + one[-95:]


def _number(x: float) -> str:
    """``1e+09`` where that is exact, else every digit (a bound of 4.29497e+09 would mislead)."""
    short = f"{x:g}"
    return short if float(short) == x else str(int(x)) if x == int(x) else repr(x)
