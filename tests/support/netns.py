"""Several "hosts" on one machine: Linux network namespaces on a bridge, for multi-host tests.

Each host is a namespace with one veth whose other end sits on a bridge in the root namespace;
the bridge has an address too, so mpirun (in the root namespace) reaches the daemons it starts
in the hosts (``launch/netns-agent``). ``limit_rate`` puts a real ``tbf`` rate limit on a host's
link. Everything is removed by :meth:`NetnsCluster.destroy`, which is safe to call at any point,
also after a half-finished :meth:`create`; a cluster left by a killed run (its maker's process
is gone) is removed by the next :meth:`create` on its subnet.

Usage::

    net = NetnsCluster("bno1234", subnet="10.213.7", hosts=2)
    try:
        net.create()
        net.limit_rate(1, "20mbit")
    finally:
        net.destroy()
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys


class NetnsError(RuntimeError):
    """A command the machine refused (the message holds the command and its stderr)."""


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetnsError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def unavailable_reason() -> str | None:
    """Why this machine cannot run the namespace test, or None when it can."""
    if os.geteuid() != 0:
        return f"network namespaces need root (CAP_SYS_ADMIN/CAP_NET_ADMIN); running as uid {os.geteuid()}"
    for tool in ("ip", "tc"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
            return f"`{tool}` (iproute2) is not installed"
    probe = f"bnoprobe{os.getpid() % 100000}"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` refused: {made.stderr.strip()}"
    run("ip", "netns", "del", probe, check=False)
    return None


def owner_alive(prefix: str) -> bool:
    """Whether the process that made cluster ``<letters><pid % 100000>`` may still run.

    True when a live Python process has a pid with those last digits (or the prefix holds no
    pid): only a cluster whose maker is surely gone is ever reclaimed.
    """
    digits = prefix.lstrip("abcdefghijklmnopqrstuvwxyz")
    if not digits.isdigit():
        return True
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) % 100000 == int(digits):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if b"python" in fh.read():
                        return True
            except OSError:
                continue
    return False


class NetnsCluster:
    """``hosts`` namespaces ``<prefix>h<i>`` at ``<subnet>.<i+1>``, bridge ``<prefix>br`` at ``<subnet>.254``."""

    def __init__(self, prefix: str, subnet: str = "10.213.7", hosts: int = 2):
        if len(prefix) > 9:  # interface names are limited to 15 characters
            raise ValueError("prefix must be at most 9 characters")
        self.prefix, self.subnet, self.n = prefix, subnet, hosts
        self.bridge = f"{prefix}br"
        self.namespaces = [f"{prefix}h{i}" for i in range(hosts)]
        self.addresses = [f"{subnet}.{i + 1}" for i in range(hosts)]
        self.host_links = [f"{prefix}v{i}" for i in range(hosts)]  # root-namespace veth ends
        self.cidr = f"{subnet}.0/24"

    def create(self) -> NetnsCluster:
        taken = self._subnet_devices()
        stale = {dev[:-2] for dev in taken if dev.endswith("br") and not owner_alive(dev[:-2])}
        for prefix in stale:  # a killed run could not remove its cluster: its owner is gone, so remove it now
            NetnsCluster(prefix, self.subnet, self.n).destroy()
        if stale:
            taken = self._subnet_devices()
        if taken:  # a second bridge on the subnet would make the routes to the hosts ambiguous
            namespaces = run("ip", "netns", "list", check=False).stdout.split()
            cleanup = "; ".join(f"ip link del {dev}" for dev in taken)
            cleanup += "".join(
                f"; ip netns del {ns}"
                for ns in namespaces
                if any(dev.endswith("br") and ns.startswith(dev[:-2] + "h") for dev in taken)
            )
            raise NetnsError(
                f"subnet {self.cidr} is already in use on {', '.join(taken)} "
                f"(another test run, or a cluster left behind by a killed one: {cleanup})"
            )
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        for ns, addr, link in zip(self.namespaces, self.addresses, self.host_links):
            inner = f"{link}n"
            run("ip", "netns", "add", ns)
            run("ip", "link", "add", link, "type", "veth", "peer", "name", inner)
            run("ip", "link", "set", inner, "netns", ns)
            run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", inner)
            run("ip", "-n", ns, "link", "set", inner, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            run("ip", "link", "set", link, "master", self.bridge)
            run("ip", "link", "set", link, "up")
        self._wait_reachable()
        return self

    def _subnet_devices(self) -> list[str]:
        return [
            line.split()[1]
            for line in run("ip", "-o", "-4", "addr", "show").stdout.splitlines()
            if f" {self.subnet}." in line
        ]

    def _wait_reachable(self, timeout: float = 10.0) -> None:
        """Each host connects over TCP to a listener on the bridge address (there is no ping here)."""
        with socket.socket() as listener:
            listener.bind((f"{self.subnet}.254", 0))
            listener.listen(len(self.namespaces))
            port = listener.getsockname()[1]
            code = (
                "import socket,sys,time\n"
                "for _ in range(int(sys.argv[3])):\n"
                "    try: socket.create_connection((sys.argv[1], int(sys.argv[2])), 1).close(); break\n"
                "    except OSError: time.sleep(0.2)\n"
                "else: sys.exit(1)\n"
            )
            for ns, addr in zip(self.namespaces, self.addresses):
                proc = run(
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    sys.executable,
                    "-c",
                    code,
                    f"{self.subnet}.254",
                    str(port),
                    str(int(timeout / 0.2)),
                    check=False,
                )
                if proc.returncode != 0:
                    raise NetnsError(f"host {addr} ({ns}) cannot reach the bridge: {proc.stderr.strip()}")
                listener.accept()[0].close()

    def netns_map(self) -> str:
        """The ``BNO_NETNS_MAP`` value for ``launch/netns-agent``."""
        return " ".join(f"{a}={ns}" for a, ns in zip(self.addresses, self.namespaces))

    def hostfile(self, path: str, slots: int) -> str:
        with open(path, "w") as fh:
            fh.writelines(f"{a} slots={slots}\n" for a in self.addresses)
        return path

    def limit_rate(self, host: int, rate: str) -> None:
        """A real slow link: ``tbf`` on the host's veth (traffic towards that host)."""
        run(
            "tc",
            "qdisc",
            "add",
            "dev",
            self.host_links[host],
            "root",
            "tbf",
            "rate",
            rate,
            "burst",
            "32kbit",
            "latency",
            "400ms",
        )

    def clear_rate(self, host: int) -> None:
        run("tc", "qdisc", "del", "dev", self.host_links[host], "root", check=False)

    def destroy(self) -> list[str]:
        """Kill what still runs in the namespaces, delete them, the veths and the bridge.

        Never raises; returns what could not be removed (empty when everything is gone).
        """
        for ns in self.namespaces:
            pids = run("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:  # only processes this test started can live in its namespaces
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for link in self.host_links:
            run("ip", "link", "del", link, check=False)  # also removes the peer and its qdisc
        for ns in self.namespaces:
            run("ip", "netns", "del", ns, check=False)
        run("ip", "link", "del", self.bridge, check=False)
        return self.leftovers()

    def leftovers(self) -> list[str]:
        """Names of this cluster's namespaces and links that still exist."""
        namespaces = run("ip", "netns", "list", check=False).stdout
        links = run("ip", "-o", "link", "show", check=False).stdout
        left = [ns for ns in self.namespaces if ns in namespaces.split()]
        left += [link for link in self.host_links + [self.bridge] if f" {link}:" in links or f" {link}@" in links]
        return left
