"""Text documents, read offline: the built-in corpus (Debian's ``fortunes``) or a user's files.

- built-in: every fortune of Debian's ``fortunes``/``fortunes-min`` packages
  (:data:`FORTUNES_DIR`, files of ``%``-separated fortunes; 15218 documents with both packages,
  36 tokens in the median and a long tail to over 1000: a one-liner beside a whole poem). The
  terminal overstriking some of them use for underlining (``_\\bA``) is removed.
- ``--data-dir DIR``: every ``*.txt`` (one document per line) and ``*.jsonl`` (one JSON object per
  line with a string ``text`` field) directly in DIR, in file-name order.

Bad input ends the run with one line naming the file and line and saying how to fix it
(:class:`UsageError`): an empty directory, a file that is not UTF-8, an empty line (an empty
document has nothing to predict), a JSON line without a ``text`` string. A document longer than
``--max-seq-len`` tokens is not an error: it is cut into pieces (:mod:`bno_hvd.data.tokens`).

Usage::

    docs = read_documents(None)            # the built-in corpus
    docs = read_documents("~/my-text")     # a user's .txt/.jsonl files
"""

from __future__ import annotations

import json
import os
import re

from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import show_path, show_text

FORTUNES_DIR = "/usr/share/games/fortunes"
EXTENSIONS = (".txt", ".jsonl")
_OVERSTRIKE = re.compile(".\x08")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")  # keeps \t and \n


def read_documents(data_dir: str | None = None) -> list[str]:
    """The documents of the built-in corpus (``data_dir`` None) or of ``data_dir``'s files."""
    if data_dir is None:
        return fortunes()
    root = os.path.expanduser(data_dir)
    if not os.path.isdir(root):
        raise UsageError(f"--data-dir {show_path(root)} is not a directory; give a directory of .txt/.jsonl files")
    files = sorted(f for f in os.listdir(root) if f.endswith(EXTENSIONS) and os.path.isfile(os.path.join(root, f)))
    if not files:
        raise UsageError(
            f"--data-dir {show_path(root)} holds no .txt or .jsonl files; put one document per line in .txt "
            'files, or one {"text": "..."} object per line in .jsonl files'
        )
    docs: list[str] = []
    for name in files:
        path = os.path.join(root, name)
        lines = _lines(path)
        docs.extend(_jsonl(path, lines) if name.endswith(".jsonl") else _txt(path, lines))
    return docs


def fortunes(folder: str = FORTUNES_DIR) -> list[str]:
    """Every fortune in ``folder`` (Debian's layout: one file per collection, ``%`` between fortunes)."""
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    paths = [os.path.join(folder, n) for n in names if "." not in n]
    paths = [p for p in paths if os.path.isfile(p) and not os.path.islink(p)]
    if not paths:
        raise UsageError(
            f"the built-in text corpus is missing ({folder}); install it with `apt-get install fortunes` "
            "(launch/setup does) or give --data-dir DIR with your own .txt/.jsonl files"
        )
    docs = []
    for path in paths:
        text = _decode(path, _read(path))
        text = _CONTROL.sub("", _OVERSTRIKE.sub("", text.replace("\r\n", "\n")))
        docs.extend(d.strip() for d in re.split(r"\n%\n", "\n" + text + "\n") if d.strip() and d.strip() != "%")
    return docs


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as err:
        raise UsageError(f"cannot read {show_path(path)}: {err.strerror or err}; check its permissions") from None


def _decode(path: str, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise UsageError(
            f"{show_path(path)} is not UTF-8 (byte 0x{raw[err.start]:02x} on line {line}); convert it, "
            f"e.g. iconv -f latin1 -t utf-8"
        ) from None


def _lines(path: str) -> list[str]:
    text = _decode(path, _read(path))
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line.removesuffix("\r") for line in lines]


def _empty_line(path: str, number: int) -> UsageError:
    return UsageError(
        f"{show_path(path)} line {number} is empty: one document per line, and an empty document has nothing "
        f"to predict; remove empty lines (sed -i '/^[[:space:]]*$/d' FILE)"
    )


def _txt(path: str, lines: list[str]) -> list[str]:
    docs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            raise _empty_line(path, number)
        docs.append(line.strip())
    return docs


def _jsonl(path: str, lines: list[str]) -> list[str]:
    docs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            raise _empty_line(path, number)
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(
                f"{show_path(path)} line {number} is not JSON ({err.msg}); write one JSON object per line"
            ) from None
        text = item.get("text") if isinstance(item, dict) else None
        if not isinstance(text, str):
            raise UsageError(
                f'{show_path(path)} line {number} has no "text" string (got {show_text(line.strip())}); '
                'write {"text": "..."} objects'
            )
        if not text.strip():
            raise UsageError(f'{show_path(path)} line {number}: "text" is empty; remove that line')
        docs.append(text.strip())
    return docs
