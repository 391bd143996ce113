"""The plain Horovod script that ``examples/horovod_mnist.py``'s port markers describe (its
"twin"), and the port as a diff (docs/porting.md, ``launch/update-docs``); the same for the plain
DDP script of ``examples/ddp_mnist.py`` (``DDP_EXAMPLE``, docs/ddp.md) and the plain Lightning
script of ``examples/lightning_mnist.py`` (``LIGHTNING_EXAMPLE``, docs/lightning.md).

A line of the port ends in one of two comments; every other line is the same in both scripts:

- ``# bno-hvd: was <line>``: the plain script has ``<line>`` there, at the same indentation;
- ``# bno-hvd: added``: the plain script has no such line.

No import beyond the standard library: ``launch/update-docs`` uses this module too.
"""

import difflib
import io
import os
import re
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "horovod_mnist.py")
DDP_EXAMPLE = os.path.join(ROOT, "examples", "ddp_mnist.py")
LIGHTNING_EXAMPLE = os.path.join(ROOT, "examples", "lightning_mnist.py")
MARKER = re.compile(r"# bno-hvd: (?:was (?P<was>\S.*)|added)")


def port_markers(source: str) -> dict[int, str | None]:
    """{line index: the plain line it replaces, or None for an added line}, from the comments that
    start with ``# bno-hvd`` (Python's tokenizer finds them: text in strings is not a comment).
    A marker must be the last thing on its line and have one of the two forms."""
    marks = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT or not tok.string.startswith("# bno-hvd"):
            continue
        row = tok.start[0] - 1
        found = MARKER.fullmatch(tok.string)
        if found is None:
            raise ValueError(f"line {row + 1}: {tok.string!r}: not '# bno-hvd: was <line>' or '# bno-hvd: added'")
        if not tok.line[: tok.start[1]].strip():
            raise ValueError(f"line {row + 1}: a '# bno-hvd' marker on a line without code")
        marks[row] = found["was"]
    return marks


def plain_twin(source: str) -> str:
    """The example with its port undone: each ``was`` line put back, each ``added`` line dropped."""
    marks = port_markers(source)
    twin = []
    for row, line in enumerate(source.splitlines()):
        if row not in marks:
            twin.append(line)
        elif marks[row] is not None:
            twin.append(line[: len(line) - len(line.lstrip())] + marks[row])
    return "\n".join(twin) + "\n"


def port_diff(source: str, context: int = 1, name: str = "examples/horovod_mnist.py", plain: str = "Horovod") -> str:
    """The unified diff from the twin to the example, as README, docs/porting.md and docs/ddp.md show it."""
    diff = difflib.unified_diff(
        plain_twin(source).splitlines(),
        source.splitlines(),
        f"plain {plain} (the twin)",
        name,
        n=context,
        lineterm="",
    )
    return "\n".join(diff) + "\n"


def example_source(path: str = EXAMPLE) -> str:
    with open(path) as fh:
        return fh.read()


def lint_failures(path: str) -> list[str]:
    """What ruff says against an example's twin (as it is) and the example itself without its
    markers' texts (which run past 120 columns, the only rule ruff.toml waives for the examples);
    empty when both keep every lint and format rule."""
    import subprocess
    import sys

    source = example_source(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    bare = re.sub(r"  # bno-hvd: (?:was .*|added)$", "  # bno-hvd", source, flags=re.M)
    failures = []
    for name, text in ((f"plain_{stem}.py", plain_twin(source)), (f"{stem}_port.py", bare)):
        check, formatted = (
            subprocess.run(
                [sys.executable, "-m", "ruff", command, "--stdin-filename", f"examples/{name}", "-"],
                input=text, capture_output=True, text=True, cwd=ROOT,
            )
            for command in ("check", "format")
        )  # fmt: skip
        if check.returncode != 0:
            failures.append(check.stdout + check.stderr)
        if formatted.returncode != 0 or formatted.stdout != text:
            failures.append(f"{name} is not ruff-formatted")
    return failures
