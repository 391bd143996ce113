"""Python's garbage collector during a run: what it costs each update, and the setup kept out of it.

A full (generation 2) collection walks every object the process tracks. After the imports and
the setup of a run (torch, torchvision, Horovod, the model, the data, and in ``bench --rounds``
every strategy's run at once) that is several hundred thousand objects: 30-400 ms on a rank at
0.45 of a core, up to 2 s on a rank at 0.15, and every other rank waits for it at the next
allreduce. Almost none of those objects ever becomes garbage while the run
trains, so walking them is pure loss.

:func:`hold_setup` moves every object the collector tracks into its permanent generation
(``gc.freeze``) once a run is set up: later collections walk only what the run creates while it
trains, and still free it. No collection runs at that moment (nothing is finalized then).
:func:`release_setup` gives the objects back when the last run that held them ends
(``gc.unfreeze``), so a finished run's model, which Horovod's hooks keep in reference cycles, is
freed by the next full collection as before. Garbage that the setup left in cycles is kept until
then.

:func:`gc_seconds` is the time the process spent in the collector, which every update logs
(``gc_time`` in ``updates.jsonl``, ``gc`` in ``ranks.json``).
"""

from __future__ import annotations

import gc
import time

_collecting = [0.0, None]  # seconds in the collector so far, and when the running collection started
_holders = [0]  # runs set up and not yet ended that hold the setup frozen


def _collector(phase: str, info: dict) -> None:
    if phase == "start":
        _collecting[1] = time.perf_counter()
    elif _collecting[1] is not None:
        _collecting[0] += time.perf_counter() - _collecting[1]
        _collecting[1] = None


def gc_seconds() -> float:
    """Seconds this process has spent in Python's garbage collector since the first call (every
    thread's collections: ``gc.callbacks``). A full collection walks every object the process
    holds; on a rank at a fraction of a core it can stall one update for seconds."""
    if _collector not in gc.callbacks:
        gc.callbacks.append(_collector)
    return _collecting[0]


def hold_setup() -> None:
    """After a run's setup: keep every object tracked now out of later collections (``gc.freeze``)."""
    gc.freeze()
    _holders[0] += 1


def release_setup() -> None:
    """When a run that called :func:`hold_setup` ends: the last one gives the objects back to the
    collector (``gc.unfreeze``), so they are freed once they are garbage."""
    _holders[0] = max(0, _holders[0] - 1)
    if _holders[0] == 0:
        gc.unfreeze()
