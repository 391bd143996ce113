"""Eq. (3) of the paper: NL_ij = T_response - T_request, measured by ping-pong over mpi4py.

Every function takes the communicator as an argument. Waiting uses ``Test`` polling that
sleeps after a short spin, so a probe running on a background thread does not steal the
cores that the training computes on (Open MPI's blocking receive spins).
"""

from __future__ import annotations

import time

import numpy as np

from bno_hvd.library.control.schedule import partner_in, rounds_for_refresh

_TAG = 7301


def _wait(req, spin_seconds: float = 0.001):
    start = time.perf_counter()
    while True:
        done, msg = req.test()
        if done:
            return msg
        if time.perf_counter() - start > spin_seconds:
            time.sleep(0.0002)


def ping_pong(comm, partner: int, initiator: bool, payload: np.ndarray, repeats: int) -> float:
    """Median round trip in seconds of ``repeats`` exchanges with ``partner`` (both call this)."""
    buf = np.empty_like(payload)
    times = []
    for k in range(repeats + 1):  # the first exchange only synchronises the pair
        if initiator:
            t_request = time.perf_counter()
            _wait(comm.Isend(payload, dest=partner, tag=_TAG))
            _wait(comm.Irecv(buf, source=partner, tag=_TAG))
            t_response = time.perf_counter()
            if k:
                times.append(t_response - t_request)
        else:
            _wait(comm.Irecv(buf, source=partner, tag=_TAG))
            _wait(comm.Isend(payload, dest=partner, tag=_TAG))
    return float(np.median(times)) if times else float("nan")


def measure_latency_row(
    comm, *, payload_bytes: int = 65536, repeats: int = 3, refresh: int = 0, max_rounds: int | None = None
) -> np.ndarray:
    """This rank's row of NL (seconds), NaN for pairs not probed in this refresh; NL_ii = 0.

    All ranks of ``comm`` must call it together. For a pair, each side initiates once, so
    both rows get a measured value.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    row = np.full(size, np.nan)
    row[rank] = 0.0
    payload = np.zeros(max(1, payload_bytes // 8), dtype=np.float64)
    _wait(comm.Ibarrier())
    for pairs in rounds_for_refresh(size, refresh, max_rounds):
        partner = partner_in(pairs, rank)
        if partner is None:
            continue
        first = rank < partner
        a = ping_pong(comm, partner, first, payload, repeats)
        b = ping_pong(comm, partner, not first, payload, repeats)
        row[partner] = a if first else b
    return row
