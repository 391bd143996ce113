"""Checkpoints that survive a kill: temporary file, fsync, rename; old ones rotated.

A checkpoint is ``<dir>/ckpt-<update:08d>.pt``; the newest complete one is the one to resume.
"""
from __future__ import annotations

import glob
import os
import re

import torch

from .errors import UsageError

_NAME = re.compile(r"ckpt-(\d{8})\.pt$")


def checkpoint_path(directory: str, update: int) -> str:
    return os.path.join(directory, f"ckpt-{update:08d}.pt")


def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """``(update, path)`` of complete checkpoints, oldest first (temporary files ignored)."""
    out = []
    for path in glob.glob(os.path.join(directory, "ckpt-*.pt")):
        m = _NAME.search(path)
        if m:
            out.append((int(m.group(1)), path))
    return sorted(out)


def save_checkpoint(directory: str, update: int, state: dict, keep: int = 3) -> str:
    """Write ``state`` atomically, then delete all but the ``keep`` newest checkpoints."""
    os.makedirs(directory, exist_ok=True)
    final = checkpoint_path(directory, update)
    tmp = final + f".tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    _fsync_dir(directory)
    for _, old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        os.remove(old)
    return final


def load_latest(directory: str) -> tuple[int, dict] | None:
    """The newest checkpoint in ``directory``, or None when there is none."""
    found = list_checkpoints(directory) if os.path.isdir(directory) else []
    if not found:
        return None
    update, path = found[-1]
    try:
        return update, torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - a damaged file is a user-facing condition
        raise UsageError(f"checkpoint {path} cannot be read ({type(err).__name__}); remove it to resume from the previous one") from None


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
