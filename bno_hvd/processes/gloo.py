"""Horovod's collectives over Gloo in an MPI-launched job (``--collectives gloo``, or ``auto``'s choice).

Under ``mpirun``/``srun`` Horovod uses MPI for its collectives, and every MPI wait busy-polls.
On a rank with a CPU quota that poll spends the quota the rank needs for its own part of the
allreduce: Horovod's background thread negotiates with every rank each cycle, a rank that is
throttled (0.5 of a core is 5 ms of every 10) answers late, and the others spin until it does.
Gloo's TCP transport waits in the kernel instead. Horovod's own launcher (``horovodrun --gloo``)
would give up the MPI world our control plane needs, so here the ranks of the MPI world set Gloo
up themselves: rank 0 runs Horovod's rendezvous store in-process, every rank learns its place
(rank, local rank, cross rank) from an MPI allgather of host names, and Horovod then initialises
with ``HOROVOD_CONTROLLER=gloo`` and ``HOROVOD_CPU_OPERATIONS=gloo`` beside mpi4py.

The store speaks HTTP without authentication, so it listens only on the address of the interface
below (127.0.0.1 on one host) and only until every rank has joined (:func:`close_rendezvous`,
right after ``hvd.init()``); Horovod's own server would listen on 0.0.0.0 for the whole job. When
Horovod starts again with a new process set (ranks that sit out: :mod:`bno_hvd.processes.sitsets`)
its ranks meet there too: a new store is open meanwhile (:func:`rendezvous_open`).

The network interface Gloo binds to: ``BNO_GLOO_IFACE`` if set; ``lo`` when every rank is on one
host; otherwise the interface holding this host's address in the subnet Open MPI was told to use
(``OMPI_MCA_btl_tcp_if_include``), else the one its host name resolves to.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from contextlib import contextmanager

from bno_hvd.common.errors import UsageError


def placement(hosts: list[str]) -> list[dict]:
    """Per rank (in rank order) its Horovod place from the host each rank runs on (pure)."""
    order = list(dict.fromkeys(hosts))
    out = []
    for rank, host in enumerate(hosts):
        same = [r for r, h in enumerate(hosts) if h == host]
        local_rank = same.index(rank)
        cross_ranks = [order_host for order_host in order if hosts.count(order_host) > local_rank]
        out.append(
            {
                "HOROVOD_RANK": rank,
                "HOROVOD_SIZE": len(hosts),
                "HOROVOD_LOCAL_RANK": local_rank,
                "HOROVOD_LOCAL_SIZE": len(same),
                "HOROVOD_CROSS_RANK": cross_ranks.index(host),
                "HOROVOD_CROSS_SIZE": len(cross_ranks),
                "HOROVOD_HOSTNAME": host,
            }
        )
    return out


def interface_for(one_host: bool, environ=os.environ) -> tuple[str, str]:
    """(interface name, its IPv4 address) for Gloo on this host; :class:`UsageError` if none fits."""
    import psutil

    addresses = {
        name: [a.address for a in addrs if a.family == socket.AF_INET] for name, addrs in psutil.net_if_addrs().items()
    }
    chosen = environ.get("BNO_GLOO_IFACE")
    if chosen is None and one_host:
        chosen = "lo"
    if chosen is None:
        subnet = environ.get("OMPI_MCA_btl_tcp_if_include", "")
        try:
            net = ipaddress.ip_network(subnet, strict=False) if "/" in subnet else None
        except ValueError:
            net = None
        for name, ips in addresses.items():
            if net is not None and any(ipaddress.ip_address(ip) in net for ip in ips):
                chosen = name
        if chosen is None:
            try:
                mine = socket.gethostbyname(socket.gethostname())
            except OSError:
                mine = None
            chosen = next((name for name, ips in addresses.items() if mine in ips), None)
    if chosen is None or not addresses.get(chosen):
        raise UsageError(
            "--collectives gloo: cannot tell which network interface links the hosts; set "
            "BNO_GLOO_IFACE=<interface> (e.g. eth0) or use --collectives mpi"
        )
    return chosen, addresses[chosen][0]


def init_gloo_env(comm, required: bool = True) -> dict | None:
    """Collective over ``comm`` (the MPI world): set this process's environment so that
    ``hvd.init()`` builds a Gloo context of the same ranks. Returns the variables set; when no
    rank can tell its interface, :class:`UsageError` if ``required``, else None (nothing set)."""
    hosts = comm.allgather(socket.gethostname())
    place = placement(hosts)[comm.Get_rank()]
    try:
        iface, address = interface_for(len(set(hosts)) == 1)
        error = None
    except UsageError as err:
        iface = address = None
        error = str(err)
    errors = comm.allgather(error)
    if any(errors):
        if not required:
            return None
        raise UsageError(next(e for e in errors if e))
    server = None
    if comm.Get_rank() == 0:
        server = RendezvousStore(address, placement(hosts))
        rendezvous = (address, server.port)
    else:
        rendezvous = None
    address, port = comm.bcast(rendezvous, root=0)
    env = {k: str(v) for k, v in place.items()}
    env.update(
        {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": address,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": iface,
        }
    )
    os.environ.update(env)
    init_gloo_env.server = server  # rank 0: closed by close_rendezvous once every rank has joined
    init_gloo_env.where = (address, placement(hosts))  # where rendezvous_open opens it again
    return env


class RendezvousStore:
    """Horovod's rendezvous key-value store (HTTP, no authentication) on ``address`` only.

    Horovod's own ``RendezvousServer.start`` listens on every interface (0.0.0.0); the store is
    only needed while the ranks build their Gloo contexts in ``hvd.init()``, and only by the ranks,
    so it listens on the interface Gloo uses (``lo`` on one host) and is closed once every rank
    has joined (:func:`close_rendezvous`)."""

    def __init__(self, address: str, places: list[dict]):
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        self.httpd = RendezvousHTTPServer((address, 0), RendezvousHandler, 0)  # port 0: the kernel picks
        self.port = self.httpd.server_address[1]
        keys = ("HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_CROSS_RANK")
        sizes = ("HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_SIZE")
        self.httpd.init([SlotInfo(*(p[k] for k in keys + sizes)) for p in places])
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="bno-gloo-rendezvous", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def close_rendezvous(comm) -> None:
    """Collective, after ``hvd.init()``: every rank has built its Gloo contexts; rank 0 closes the store."""
    comm.Barrier()
    server = getattr(init_gloo_env, "server", None)
    if server is not None:
        server.close()
        init_gloo_env.server = None


@contextmanager
def rendezvous_open(comm):
    """Collective over ``comm`` (the MPI world): a new store open (rank 0), and every rank told its
    port, while Horovod starts again (``hvd.init`` with a new process set, which returns once every
    rank's Gloo contexts are built); closed after."""
    server = RendezvousStore(*init_gloo_env.where) if comm.Get_rank() == 0 else None
    os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"] = str(comm.bcast(server and server.port, root=0))
    try:
        yield
    finally:
        comm.Barrier()
        if server is not None:
            server.close()
