"""Checkpoints that survive a kill: temporary file, fsync, rename; old ones rotated.

A checkpoint is ``<dir>/ckpt-<update:08d>.pt``; the newest complete one is the one to resume.
It holds everything the next update depends on, so a resumed run continues exactly where the
killed one stood: model, optimizer (momentum/Adam moments), the balancer (updates done, the
allocations already decided for the next updates, the sample stream's epoch and offset, the
strategy's state), every rank's RNG states, and the config it was made with. It never holds a
data loader's prefetch position: a resumed loader starts at the next update to run.

Usage (every rank calls both; only rank 0 touches the files)::

    resumed_from = restore_training_state(cfg, comm, model, optimizer, balancer)  # None: fresh
    ...
    save_training_state(cfg, comm, model, optimizer, balancer)
"""

from __future__ import annotations

import glob
import numbers
import os
import random
import re
import warnings

import numpy as np
import torch

from bno_hvd.common.atomic import atomic_write, fsync_directory, is_temporary
from bno_hvd.common.errors import TrainingError, UsageError
from bno_hvd.common.parsing import clip, show_path, show_value

_NAME = re.compile(r"ckpt-(\d{8})\.pt$")

# Flags that shape the training state: a checkpoint only resumes under the same values.
# (--updates, --lr, --log-dir, the checkpoint flags and the like may change between runs.)
STATE_FLAGS = (
    "model",
    "dataset",
    "synthetic_size",
    "max_seq_len",
    "vocab_size",
    "allocate_by",
    "global_tokens",
    "strategy",
    "base_batch_size",
    "batch_sizes",
    "global_batch",
    "optimizer",
    "dtype",
    "seed",
)


def checkpoint_path(directory: str, update: int) -> str:
    return os.path.join(directory, f"ckpt-{update:08d}.pt")


def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """``(update, path)`` of complete checkpoints, oldest first (temporary files ignored)."""
    out = []
    for path in glob.glob(os.path.join(glob.escape(directory), "ckpt-*.pt")):
        m = _NAME.search(path)
        if m:
            out.append((int(m.group(1)), path))
    return sorted(out)


def save_checkpoint(directory: str, update: int, state: dict, keep: int = 3) -> str:
    """Write ``state`` atomically, then delete all but the ``keep`` newest checkpoints (0: keep all).

    A kill at any point leaves either the previous set of checkpoints or the new one complete:
    the file only gets its final name after its bytes are on disk.
    """
    final = atomic_write(checkpoint_path(directory, update), lambda fh: torch.save(state, fh), binary=True)
    for _, old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        os.remove(old)
    # a writer killed mid-write leaves its temporary file behind; only rank 0 writes here
    for stale in glob.glob(os.path.join(glob.escape(directory), "ckpt-*.pt.tmp.*")):
        if is_temporary(stale):
            os.remove(stale)
    fsync_directory(directory)
    return final


def load_latest(directory: str) -> tuple[int, dict] | None:
    """The newest checkpoint in ``directory``, or None when there is none."""
    found = list_checkpoints(directory) if os.path.isdir(directory) else []
    if not found:
        return None
    update, path = found[-1]
    try:
        # weights_only: a foreign ckpt-*.pt cannot run code here; numpy's RNG state (an array of
        # uint32) is the one non-torch object a checkpoint holds, so its rebuilders are allowed
        with torch.serialization.safe_globals(_numpy_rng_globals()), warnings.catch_warnings():
            # a foreign file in an old pickle protocol: torch warns before failing or loading it
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return update, torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - a damaged file is a user-facing condition
        raise UsageError(
            f"checkpoint {show_path(path)} cannot be read ({type(err).__name__}); "
            "remove it to resume from the previous one"
        ) from None


def read_checkpoint(directory: str, config: dict) -> tuple[int, dict] | None:
    """The newest checkpoint in ``directory`` if it can resume a run of ``config`` (a
    ``TrainConfig.to_dict()``); None when there is none. A file that is not a bno-hvd checkpoint
    (anything else torch can load, under a ckpt-*.pt name) or was made with other
    :data:`STATE_FLAGS` raises :class:`UsageError`."""
    found = load_latest(directory)
    if found is None:
        return None
    update, state = found
    where = checkpoint_path(directory, update)
    if not _well_formed(state):
        raise UsageError(
            f"checkpoint {show_path(where)} is not a bno-hvd checkpoint (it needs model, optimizer, balancer "
            "and config); remove it to resume from the previous one"
        )
    check_compatible(state.get("config", {}), config, where)
    return update, state


def _well_formed(state) -> bool:
    """The shapes save_training_state writes, checked before torch sees them (torch's own loaders
    take a tensor for a list of parameter groups, and warn or fail in ways no user can read)."""
    if not isinstance(state, dict) or not all(
        isinstance(state.get(k), dict) for k in ("model", "optimizer", "balancer")
    ):
        return False
    optimizer = state["optimizer"]
    groups = optimizer.get("param_groups")
    return (
        isinstance(state.get("config", {}), dict)
        and all(isinstance(v, torch.Tensor) for v in state["model"].values())
        and isinstance(optimizer.get("state"), dict)
        and isinstance(groups, list)
        and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
        and _plain_data(state["balancer"])
        and all(isinstance(state["balancer"].get(k), dict) for k in ("plan", "sampler"))
    )


def _plain_data(obj, limit: int = 10**6) -> bool:
    """True when ``obj`` is JSON-like (what Balancer.state_dict writes): no tensors, no objects.
    Iterative, so a deeply nested foreign file cannot overflow the stack."""
    stack = [obj]
    while stack:
        limit -= 1
        item = stack.pop()
        if limit < 0:
            return False
        if isinstance(item, dict):
            if not all(isinstance(k, str) for k in item):
                return False
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif not (item is None or isinstance(item, (str, numbers.Number))):  # numpy scalars too
            return False
    return True


def parameters_finite(model) -> bool:
    """True when every parameter and buffer of ``model`` is finite."""
    return all(bool(torch.isfinite(t).all()) for t in model.state_dict().values() if t.is_floating_point())


def save_training_state(cfg, comm, model, optimizer, balancer, ledger=None) -> str | None:
    """Collective over ``comm``: checkpoint the state before update ``balancer.update``.

    Parameters that became non-finite are never written (the previous checkpoint stays the
    newest); every rank then raises :class:`TrainingError` (parameters are the same on all ranks).
    Returns the path on rank 0, None elsewhere.
    """
    if not parameters_finite(model):
        raise TrainingError(
            f"parameters became non-finite at update {balancer.update}; not checkpointed "
            f"(the last good checkpoint in {cfg.checkpoint_dir} is kept); lower --lr"
        )
    state = balancer.state_dict()  # only rank 0's carries the strategy
    rngs = comm.gather(_rng_state(), root=0)
    if comm.Get_rank() != 0:
        return None
    return save_checkpoint(
        cfg.checkpoint_dir,
        balancer.update,
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "balancer": state,
            "rng": rngs,
            "config": cfg.to_dict(),
            "ledger": [] if ledger is None else ledger.entries,  # the stream ranges of updates 0 .. update-1
        },
        keep=cfg.keep_checkpoints,
    )


def restore_training_state(cfg, comm, model, optimizer, balancer, ledger=None) -> int | None:
    """Collective over ``comm``: load the newest checkpoint; returns its update, or None if none.
    ``ledger`` (:class:`~bno_hvd.training.ledger.Ledger`) gets the checkpoint's entries as ``resumed``.

    Rank 0 reads and checks the file; model and optimizer are then broadcast by the caller
    (Horovod), the balancer state and RNG states go out here. Any problem raises the same
    :class:`UsageError` on every rank, so no rank is left waiting in a collective.
    """
    error, info, rngs = None, None, None
    size = comm.Get_size()
    if comm.Get_rank() == 0:
        try:
            found = read_checkpoint(cfg.checkpoint_dir, cfg.to_dict())
            if found is not None:
                update, state = found
                where = show_path(checkpoint_path(cfg.checkpoint_dir, update))
                try:
                    model.load_state_dict(state["model"])
                    optimizer.load_state_dict(state["optimizer"])
                    balancer.load_state_dict(state["balancer"])
                except UsageError:
                    raise
                except _MISFIT as err:  # the file's data does not have the shapes and types of this run
                    reason = clip(str(err), 200) if str(err).strip() else type(err).__name__
                    raise UsageError(
                        f"checkpoint {where} does not fit this run ({reason}); resume with "
                        "the flags and process count it was made with"
                    ) from None
                info = {"update": update, "balancer": state["balancer"], "ledger": _ledger_of(state)}
                rngs = _usable_rngs(state.get("rng"), size, where)
        except UsageError as err:
            error = str(err)
    error, info = comm.bcast((error, info), root=0)
    if error:
        raise UsageError(error)
    if info is None:
        return None
    if comm.Get_rank() != 0:
        balancer.load_state_dict(info["balancer"])  # what rank 0 loaded without an error
    if ledger is not None:
        ledger.resumed = info["ledger"]
    mine = comm.scatter(rngs if comm.Get_rank() == 0 else None, root=0)
    if mine is not None:
        _set_rng_state(mine)
    return int(info["update"])


def _ledger_of(state: dict) -> list | None:
    """The checkpoint's ledger entries when they are plain data (None: an older checkpoint without them)."""
    entries = state.get("ledger")
    ok = isinstance(entries, list) and _plain_data(entries) and all(isinstance(e, dict) for e in entries)
    return entries if ok else None


# What applying another run's (or a damaged) state raises; every one means "does not fit".
_MISFIT = (KeyError, ValueError, RuntimeError, TypeError, AttributeError, IndexError, OverflowError)


def _usable_rngs(rngs, size: int, where: str) -> list:
    """The per-rank RNG states to scatter, each tried here on rank 0 first: a damaged one would
    otherwise fail on its own rank after the collective, and leave the others waiting."""
    if isinstance(rngs, dict):  # older checkpoints hold rank 0's states only
        rngs = [rngs] + [None] * (size - 1)
    if not isinstance(rngs, list) or len(rngs) != size:
        return [None] * size
    current = _rng_state()
    try:
        for rank, state in enumerate(rngs):
            if state is not None:
                try:
                    if not isinstance(state, dict) or set(state) != {"torch", "numpy", "python"}:
                        raise TypeError("not the torch/numpy/python states")  # a tensor here made torch warn
                    _set_rng_state(state)
                except _MISFIT as err:
                    raise UsageError(
                        f"checkpoint {where} holds damaged RNG states for rank {rank} ({type(err).__name__}); "
                        "remove it to resume from the previous one"
                    ) from None
    finally:
        _set_rng_state(current)
    return rngs


def check_compatible(saved: dict, current: dict, where: str) -> None:
    """Raise :class:`UsageError` when a flag in :data:`STATE_FLAGS` differs from the checkpoint's.

    ``saved`` comes out of a file: a value that is not plain data (a tensor, an array, an object
    of another program) never equals the run's, and is shown by its type, never compared.
    """
    for key in STATE_FLAGS:
        if key in saved and _plain(saved[key]) != _plain(current.get(key)):
            flag = "--" + key.replace("_", "-")
            raise UsageError(
                f"checkpoint {show_path(where)} was made with {flag} {_show(saved[key])} but this run has "
                f"{flag} {_show(current.get(key))}; resume with the same value or use another --checkpoint-dir"
            )


_NOT_PLAIN = object()  # equals only itself: a saved value that is not plain data never matches


def _plain(value):
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, (list, tuple)) and all(x is None or isinstance(x, (str, int, float)) for x in value):
        return list(value)
    return _NOT_PLAIN


def _show(value) -> str:
    if isinstance(_plain(value), list):
        return show_value(",".join(map(str, value)), 60).strip('"')
    if _plain(value) is _NOT_PLAIN:
        return f"<a {type(value).__name__}>"
    return show_value(value, 60).strip('"')


def _numpy_rng_globals() -> list:
    """What unpickling ``np.random.get_state()``'s key array needs, and nothing more."""
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
