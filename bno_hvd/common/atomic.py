"""Files that readers, and a run killed at any moment, see whole or not at all.

Every output the project writes in one piece (JSON, CSV, PNG, checkpoints, saved models, a clean
hostfile) goes through :func:`atomic_write`: the bytes go to ``<path>.tmp.<pid>`` next to the
target, are flushed and fsynced, and only then renamed over ``path`` (then the directory is
fsynced, so the rename itself survives a crash). A writer killed half-way leaves its temporary
file behind, never a torn ``path``; :func:`is_temporary` recognises such leftovers.

Usage::

    write_json_atomic("runs/a/result.json", {"accuracy": 0.9})
    atomic_write("model.pt", lambda fh: torch.save(state, fh), binary=True)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

TEMP_MARK = ".tmp."


def temporary_path(path: str) -> str:
    """The temporary name :func:`atomic_write` uses for ``path`` in this process."""
    return f"{path}{TEMP_MARK}{os.getpid()}"


def is_temporary(path: str) -> bool:
    """True for a leftover of an interrupted :func:`atomic_write` (any process)."""
    head, sep, pid = os.path.basename(path).rpartition(TEMP_MARK)
    return bool(head and sep and pid.isdigit())


def atomic_write(path: str, write: Callable, *, binary: bool = False) -> str:
    """Call ``write(fh)`` on a temporary file, make it durable, then rename it to ``path``.

    Returns ``path``. If ``write`` raises, the temporary file is removed and ``path`` is untouched.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": ""})) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_directory(directory)
    return path


def write_json_atomic(path: str, obj) -> str:
    """``obj`` as indented JSON, atomically."""
    return atomic_write(path, lambda fh: json.dump(obj, fh, indent=1))


def write_text_atomic(path: str, text: str) -> str:
    return atomic_write(path, lambda fh: fh.write(text))


def fsync_directory(directory: str) -> None:
    """Make a rename inside ``directory`` durable (best effort: some filesystems refuse)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
