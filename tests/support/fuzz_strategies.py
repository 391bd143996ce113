"""Hypothesis strategies that build what a user can type or point bno-hvd at (issue 15).

Each builder draws mostly *near-valid* input (so that the deep paths run: a metrics file that
loads is then allocated by every strategy) and sometimes anything at all: other JSON, raw bytes,
text, 100,000 levels of nesting, huge and tiny numbers, NaN/inf, unicode, empty files, odd file
names. ``tests/cli/test_fuzz_inputs.py`` holds every surface to its property.
"""

from __future__ import annotations

import json
import math
import re

from hypothesis import strategies as st

from bno_hvd.allocation import STRATEGY_NAMES
from bno_hvd.data.catalog import MODEL_NAMES

# -- building blocks --------------------------------------------------------------------------

ODD_FLOATS = [0.0, -0.0, 5e-324, 1e-310, 1e-300, 1e-9, 0.5, 1e9, 1e18, 1e300, 1.7976931348623157e308]
ODD_FLOATS += [math.inf, -math.inf, math.nan, -1.0, -1e308]
ODD_INTS = [0, -1, 1, 2**31, 2**53 + 1, 2**63, 2**64, 10**20, 10**400]
HUGE_LITERALS = ["1" * 5000, "1e999", "-1e999", "NaN", "Infinity", "-Infinity", "1" + "0" * 400, "0." + "0" * 400 + "1"]

# characters that break a line or a terminal, and the separators our formats use
SPECIAL_CHARS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x00\x1b\t ,:=#\"'\\\ufeff"


def texts(max_size=12, min_size=0):
    """Any text, with line breaks, NUL, escapes and our separators far more often than chance."""
    alphabet = st.one_of(st.characters(exclude_categories=("Cs",)), st.sampled_from(SPECIAL_CHARS))
    return st.text(alphabet, min_size=min_size, max_size=max_size)


numbers = st.one_of(
    st.integers(),
    st.floats(),
    st.sampled_from(ODD_FLOATS + ODD_INTS),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(min_value=-1e-300, max_value=1e-300),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts())
# A value nested 1 to 990 levels deep (just within what json parses): a marker string that
# dumps() writes out as [[[...0...]]], so that building and printing it never recurses here.
deep_values = st.integers(1, 990).map(lambda depth: f"@@deep{depth}@@")
any_json = st.one_of(
    st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=5) | st.dictionaries(texts(8), inner, max_size=5),
        max_leaves=25,
    ),
    deep_values,
)


def mostly(good, *bad):
    """``good`` four times in five (Hypothesis picks a branch uniformly), else one of ``bad``."""
    bad = bad or (scalars,)
    return st.one_of(*[good] * (4 * len(bad)), *bad)


def dumps(value) -> str:
    """JSON text as Python writes it (NaN and Infinity included, as Python's json reads them)."""
    return re.sub(r'"@@deep(\d+)@@"', lambda m: "[" * int(m[1]) + "0" + "]" * int(m[1]), json.dumps(value))


def paths_in(obj, prefix=()):
    """Every place in a checkpoint's nested dicts and lists (tensors and arrays are leaves)."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from paths_in(v, prefix + (k,))
    elif isinstance(obj, (list, tuple)) and len(obj) < 50:
        for i, v in enumerate(obj):
            yield from paths_in(v, prefix + (i,))


def replaced(obj, path, value, delete=False):
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        out = dict(obj)
        if delete and not rest:
            out.pop(head, None)
        else:
            out[head] = replaced(obj[head], rest, value, delete)
        return out
    out = list(obj)
    if delete and not rest:
        del out[head]
    else:
        out[head] = replaced(obj[head], rest, value, delete)
    return type(obj)(out) if isinstance(obj, tuple) else out


@st.composite
def mutated(draw, valid, odd=None):
    """A document from ``valid``, untouched half the time, else with one or two places replaced
    by ``odd`` values (any JSON by default) or removed: near-valid input reaches the deep checks."""
    doc = draw(valid)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
        path = draw(st.sampled_from(list(paths_in(doc))))
        value = draw(odd if odd is not None else st.one_of(numbers, any_json))
        doc = replaced(doc, path, value, delete=draw(st.integers(0, 4)) == 0)
    return doc


# -- files ------------------------------------------------------------------------------------

safe_names = st.sampled_from(["input.json", "metrics.json", "schedule", "hosts", "x"])
odd_names = (
    texts(30, min_size=1).map(lambda s: s.replace("/", "_").replace("\x00", "_")).filter(lambda s: s not in (".", ".."))
)
file_names = st.one_of(safe_names, safe_names, odd_names).filter(
    lambda s: s not in (".", "..") and len(s.encode()) <= 200
)


@st.composite
def deep_nesting(draw) -> bytes:
    """``[[[[...]]]]`` or ``{"a": {"a": ...}}`` at 1 to 200,000 levels, closed or not."""
    depth = draw(st.one_of(st.integers(1, 2000), st.integers(900, 1100), st.integers(1, 200_000)))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ('{"ops":', "}"), ('[{"update":', "}]")]))
    body = draw(st.sampled_from(["", "1", "null", '"x"']))
    closed = draw(st.booleans())
    return (opener * depth + body + (closer * depth if closed else "")).encode()


@st.composite
def spliced(draw, text_strategy) -> bytes:
    """Valid-looking JSON text with a piece cut out or replaced: truncation, a huge literal, bad UTF-8."""
    text = draw(text_strategy).encode()
    at = draw(st.integers(0, len(text)))
    cut = draw(st.integers(0, 8))
    piece = draw(
        st.one_of(
            st.sampled_from(HUGE_LITERALS).map(str.encode),
            st.binary(max_size=4),
            st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\xef\xbb\xbf", b'"\\ud800"', b"[" * 3000]),
        )
    )
    return text[:at] + piece + text[at + cut :]


def json_file(documents) -> st.SearchStrategy[bytes]:
    """File contents around ``documents`` (a strategy of JSON values of the right shape)."""
    text = documents.map(dumps)
    return st.one_of(
        *[text.map(str.encode)] * 12,
        spliced(text),
        any_json.map(lambda v: dumps(v).encode()),
        st.binary(max_size=300),
        texts(max_size=300).map(str.encode),
        deep_nesting(),
        st.just(b""),
    )


# -- metrics files (bno-hvd allocate --metrics) -----------------------------------------------

ops_values = st.one_of(st.floats(1e-3, 1e5), st.floats(1e-3, 1e9), st.just(0.0), st.none())  # samples/s
memory_values = st.one_of(st.floats(0, 64e9), st.floats(0, 1e18), st.integers(0, 2**40))  # bytes
latency_values = st.one_of(st.floats(0, 1e-2), st.floats(0, 60))  # seconds


@st.composite
def valid_metrics(draw, sparse: bool):
    """A metrics file the parser must accept (values anywhere in their physical ranges)."""
    n = draw(st.integers(1, 6))
    doc = {
        "ops": draw(st.lists(ops_values, min_size=n, max_size=n)),
        "memory_used": draw(st.lists(memory_values, min_size=n, max_size=n)),
    }
    upper = {(i, j): draw(latency_values) for i in range(n) for j in range(i + 1, n)}
    if sparse:
        pairs = [[i, j, sec] for (i, j), sec in upper.items() if draw(st.booleans())] or [[0, 0 if n == 1 else 1, 0.1]]
        doc["latency"] = {"pairs": pairs if n > 1 else []}
    else:
        doc["latency"] = [[0.0 if i == j else upper[min(i, j), max(i, j)] for j in range(n)] for i in range(n)]
    if draw(st.booleans()):
        doc["max_batch"] = draw(st.lists(st.one_of(st.none(), st.integers(1, 10**6)), min_size=n, max_size=n))
    if draw(st.booleans()):
        sample = st.tuples(st.integers(1, 10**6), st.floats(1e-6, 86400)).map(list).filter(lambda p: p[0] / p[1] <= 1e9)
        doc["compute_samples"] = draw(st.lists(st.lists(sample, max_size=4), min_size=n, max_size=n))
    return doc


def metrics_files(sparse: bool):
    return st.fixed_dictionaries({"name": file_names, "content": json_file(mutated(valid_metrics(sparse)))})


# -- emulation schedules (--emulate-schedule) -------------------------------------------------


@st.composite
def valid_schedule(draw, n, key="speeds", low=0.01, high=100.0):
    updates = [0] + draw(st.lists(st.integers(1, 10**9), max_size=4, unique=True))
    values = st.lists(st.one_of(st.floats(low, high), st.sampled_from([low, high, 1, 0.33])), min_size=n, max_size=n)
    return [{"update": u, key: draw(values)} for u in draw(st.permutations(updates))]


@st.composite
def schedule_files(draw, key="speeds", low=0.01, high=100.0):
    """``--emulate-schedule`` files (speeds), or with ``key="quotas"`` ``--cpu-quota-schedule`` files."""
    n = draw(st.integers(1, 5))
    valid = valid_schedule(n, key, low, high)
    content = draw(json_file(mutated(valid, st.one_of(numbers, any_json, st.just([1] * n)))))
    return {"name": draw(file_names), "content": content, "n_ranks": n}


# -- hostfiles ---------------------------------------------------------------------------------

host_names = mostly(
    st.sampled_from(["localhost", "node1", "10.0.0.2", "gpu-box_3", "n.example.org"]),
    texts(max_size=20),
    st.sampled_from(["a:2", "a,b", "x=y", "slots=2", "#", "\ufefflocalhost", "a\x00b", "\u2028", "é"]),
)
slot_values = mostly(
    st.integers(1, 64).map(str),
    st.sampled_from(["0", "-1", "", "four", "٣", "1.5", "99999999999999999999", "4096", "4097", "0001"]),
    st.integers(min_value=0).map(str),
    texts(max_size=4),
)
host_lines = st.one_of(
    st.builds(
        lambda h, s, tail: f"{h} slots={s}{tail}", host_names, slot_values, mostly(st.just(""), texts(max_size=8))
    ),
    st.builds(lambda h, s: f"{h}:{s}", host_names, slot_values),
    st.sampled_from(["", "   ", "\t", "# comment", "  # indented", "slots=2 localhost"]),
    texts(max_size=30),
)


valid_host_lines = st.tuples(
    st.one_of(
        st.from_regex(r"[a-z][a-z0-9-]{0,12}(\.[a-z0-9]{1,6}){0,2}", fullmatch=True), st.ip_addresses(v=4).map(str)
    ),
    st.integers(1, 4096),
    st.sampled_from(["", "  # a comment", "\t#", " "]),
)


@st.composite
def hostfile_content(draw) -> bytes:
    if not draw(st.integers(0, 9)):
        return draw(st.one_of(st.binary(max_size=200), st.just(b"")))
    sep = draw(mostly(st.just("\n"), st.sampled_from(["\r\n", "\r", "\x0b", "\u2028", "\x85"])))
    hosts = draw(st.lists(valid_host_lines, min_size=1, max_size=5, unique_by=lambda h: h[0]))
    lines = [f"{name} slots={slots}{tail}" for name, slots, tail in hosts]
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):  # blank lines, comments, or one odd line
        lines.insert(draw(st.integers(0, len(lines))), draw(mostly(st.sampled_from(["", "# c", "  "]), host_lines)))
    bom = draw(st.sampled_from([""] * 5 + ["\ufeff"]))
    return (bom + sep.join(lines) + draw(st.sampled_from(["", sep]))).encode("utf-8", "surrogatepass")


hostfiles = st.fixed_dictionaries({"name": file_names, "content": hostfile_content()})


# -- comma-separated list flags ----------------------------------------------------------------

list_tokens = st.one_of(
    st.integers(-5, 100).map(str),
    st.floats().map(repr),
    st.sampled_from(
        ["nan", "inf", "-inf", "1e-300", "1e308", "0x10", "1_000", "+3", "٣", "", " ", "1e999", "9" * 5000]
    ),
    st.sampled_from(["0.0", "-0", "1.5", "0.01", "100", "100.0001", "0.00999", "1000000", "1000001", "65536"]),
    texts(max_size=5),
)


@st.composite
def list_flag_text(draw, names=None):
    token = list_tokens if names is None else mostly(st.sampled_from(names), texts(max_size=8))
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(texts(100))
    if kind == 1:  # at the supported number of entries, and one more
        return ",".join([draw(st.sampled_from(["1", "2", "0.5"]))] * draw(st.sampled_from([65536, 65537])))
    sep = draw(mostly(st.just(","), st.sampled_from([", ", " ,", ",,", ";", "\n,"])))
    return sep.join(draw(st.lists(token, max_size=8)))


strategy_lists = list_flag_text(STRATEGY_NAMES)
model_lists = list_flag_text(MODEL_NAMES)


def metrics_file(raw=None, **fields):
    """A valid two-rank metrics file (``{"name", "content"}``), with ``fields`` replaced or ``raw`` bytes."""
    doc = {"ops": [100.0, 50.0], "memory_used": [1e9, 2e9], "latency": [[0, 1e-4], [1e-4, 0]], **fields}
    return {"name": "metrics.json", "content": raw if raw is not None else json.dumps(doc).encode()}
