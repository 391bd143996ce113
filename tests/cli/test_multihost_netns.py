"""Two hosts for real: network namespaces on a bridge, a 4-rank job across them, a slow link.

The hosts are Linux network namespaces with their own addresses (tests/support/netns.py); mpirun
starts its daemons in them through ``launch/netns-agent`` (its plm_rsh_agent), as it would
over ssh on a cluster, with a hostfile of 2 slots per host. Then a ``tbf`` rate limit on one
host's link must raise the measured NL_ij of the pairs that cross it: the network term of the
allocation, measured on a real link. Everything is removed again, also when a test fails;
where the machine forbids namespaces or tbf, the tests skip and say why.
"""

import json
import os
import subprocess

import numpy as np
import pytest
from support.jobs import ROOT, assert_ok, bno_cmd, mpi_env, run_cli
from support.netns import NetnsCluster, NetnsError, unavailable_reason

pytestmark = [pytest.mark.mpi, pytest.mark.root]

AGENT = os.path.join(ROOT, "launch", "netns-agent")
PROBE_BYTES = 262144  # 2 x 256 KiB per round trip: a rate limit shows, jitter does not
RATE = "50mbit"  # -> >= 84 ms per round trip across the limited link


def refused(err: Exception) -> bool:
    text = str(err)
    return any(
        s in text for s in ("Operation not permitted", "not supported", "Permission denied", "qdisc kind is unknown")
    )


# session scope: made once per pytest process, whatever order a parallel run gives the tests
# (module scope made it twice in one xdist worker, the second on the first's subnet)
@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    net = NetnsCluster(f"bno{os.getpid() % 100000}")
    try:
        net.create()
    except BaseException as err:  # a timeout too: nothing of a half-made cluster may stay behind
        left = net.destroy()
        if isinstance(err, NetnsError) and refused(err) and not left:
            pytest.skip(f"this machine refused the namespace network: {err}")
        raise
    net.hostfile_path = net.hostfile(str(tmp_path_factory.mktemp("hosts") / "hostfile"), slots=2)
    net.tmpdir = str(tmp_path_factory.mktemp("host-tmp"))  # each host's own tmpdir (launch/netns-agent)
    yield net
    left = net.destroy()
    assert not left, f"left behind: {left}"


def mpirun_on(net, args, timeout=180):
    """``args`` on 4 ranks, 2 per namespace host, via the netns agent (like ssh on a cluster)."""
    cmd = [
        "mpirun",
        "-np",
        "4",
        "--hostfile",
        net.hostfile_path,
        "--map-by",
        "slot",
        "--bind-to",
        "none",
        "--mca",
        "plm_rsh_agent",
        AGENT,
        "--mca",
        "plm_rsh_no_tree_spawn",
        "1",
        # tcp only: vader names its /dev/shm segments by hostname and local rank, which the two
        # "hosts" share (one hostname, one /dev/shm); between real hosts it is tcp anyway
        "--mca",
        "btl",
        "tcp,self",
        "--mca",
        "btl_tcp_if_include",
        net.cidr,
        "--mca",
        "oob_tcp_if_include",
        net.cidr,
        # no --daemonize: a daemon that dies ends mpirun with an error instead of a wait forever
        "--mca",
        "orte_leave_session_attached",
        "1",
        "-x",
        "PATH",
        "-x",
        "PYTHONPATH",
    ] + list(args)
    env = mpi_env({"BNO_NETNS_MAP": net.netns_map(), "BNO_NETNS_TMPDIR": net.tmpdir})
    env.pop("OMPI_MCA_rmaps_base_oversubscribe", None)  # the hostfile's slots must suffice
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def probe(net, out_path):
    proc = mpirun_on(
        net,
        bno_cmd("probe", "--steps", "3", "--repeats", "5", "--probe-bytes", str(PROBE_BYTES), "--out", str(out_path)),
    )
    assert_ok(proc)
    return json.loads(out_path.read_text())


@pytest.fixture(scope="module")
def unlimited(cluster, tmp_path_factory):
    """One probe of the unlimited links (its metrics file): shared by the two tests that need one."""
    path = tmp_path_factory.mktemp("probe") / "metrics.json"
    probe(cluster, path)
    return path


def cross_and_local(latency):
    """Mean NL over pairs across the two hosts, and over pairs inside host 1 (ranks 2, 3)."""
    lat = np.array(latency)
    return float(lat[:2, 2:].mean()), float(lat[2, 3])


def test_launch_across_hosts_is_reliable(cluster):
    """Many short launches in a row. With one shared tmpdir, 7 of 40 launches crashed a daemon
    (orted and its hwloc.sm session file: launch/netns-agent) and then hung."""
    hello = (
        "from mpi4py import MPI; import os; c = MPI.COMM_WORLD; "
        "names = c.allgather(os.environ['OMPI_MCA_orte_tmpdir_base']); total = c.allreduce(c.rank); "
        "print('hosts', len(set(names)), total) if c.rank == 0 else None"
    )
    for attempt in range(12):
        proc = mpirun_on(cluster, ["python", "-c", hello], timeout=60)
        assert_ok(proc)
        assert "hosts 2 6" in proc.stdout, f"launch {attempt}: {proc.stdout!r}"
    assert sorted(os.listdir(cluster.tmpdir)) == sorted(cluster.namespaces)


def test_second_cluster_on_a_taken_subnet_is_refused(cluster):
    other = NetnsCluster(f"bnx{os.getpid() % 100000}", subnet=cluster.subnet)
    with pytest.raises(NetnsError, match=f"subnet {cluster.cidr} is already in use on {cluster.bridge}"):
        other.create()
    assert other.destroy() == []


def test_a_cluster_left_by_a_killed_run_is_reclaimed(cluster):
    """A killed run cannot remove its cluster; the next run removes it (its maker is gone), once."""
    live = {int(p) % 100000 for p in os.listdir("/proc") if p.isdigit()}
    dead = next(n for n in range(99999, 0, -1) if n not in live)
    subnet = "10.213.8"  # the session's cluster holds 10.213.7
    left, mine = NetnsCluster(f"bno{dead}", subnet=subnet), NetnsCluster(f"bnx{os.getpid() % 100000}", subnet=subnet)
    try:
        left.create()
        assert left.leftovers()  # it stands, as a killed run would leave it
        mine.create()
        assert left.leftovers() == [] and len(mine.leftovers()) == 5
    finally:
        assert left.destroy() == [] and mine.destroy() == []


def test_four_ranks_across_two_hosts(cluster, unlimited, tmp_path):
    metrics = json.loads(unlimited.read_text())
    lat = np.array(metrics["latency"])
    assert lat.shape == (4, 4) and len(metrics["ops"]) == 4 and len(metrics["memory_used"]) == 4
    assert np.all(np.diag(lat) == 0) and np.all(lat[~np.eye(4, dtype=bool)] > 0)
    alloc = run_cli("allocate", "--metrics", str(unlimited), "--strategy", "bno")
    assert_ok(alloc)
    assert len(json.loads(alloc.stdout)["batch_sizes"]) == 4

    log_dir = tmp_path / "log"
    proc = mpirun_on(
        cluster,
        bno_cmd(
            "train",
            "--dataset",
            "synthetic",
            "--strategy",
            "bno",
            "--base-batch-size",
            "16",
            "--updates",
            "10",
            "--rebalance-every",
            "5",
            "--latency-interval",
            "1",
            "--no-eval",
            "--no-progress",
            "--log-dir",
            str(log_dir),
        ),
    )
    assert_ok(proc)
    run = json.loads((log_dir / "run.json").read_text())
    assert run["world_size"] == 4
    records = [json.loads(line) for line in (log_dir / "updates.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records] == list(range(10))
    assert all(len(r["batch_sizes"]) == 4 and min(r["batch_sizes"]) >= 1 for r in records)
    assert any(r["batch_sizes"] != [16] * 4 for r in records[5:])  # eq. (5) allocated for all 4 ranks
    memory = [r["rank_memory"] for r in records if r.get("rank_memory")]
    assert memory and all(len(m) == 4 and all(v > 0 for v in m) for m in memory)


def test_rate_limit_on_one_host_raises_its_cross_host_latency(cluster, unlimited, tmp_path):
    before = json.loads(unlimited.read_text())
    try:
        cluster.limit_rate(1, RATE)
    except NetnsError as err:
        if refused(err):
            pytest.skip(f"this machine refused the tbf qdisc: {err}")
        raise
    try:
        after = probe(cluster, tmp_path / "after.json")
    finally:
        cluster.clear_rate(1)
    cross_before, local_before = cross_and_local(before["latency"])
    cross_after, local_after = cross_and_local(after["latency"])
    print(
        f"NL across hosts: {cross_before * 1e3:.2f} ms -> {cross_after * 1e3:.2f} ms with tbf {RATE}; "
        f"inside host 1: {local_before * 1e3:.2f} -> {local_after * 1e3:.2f} ms"
    )
    floor = 2 * PROBE_BYTES * 8 / 50e6  # seconds the payload needs at the rate, both ways
    # Margins from the physical floor of the limited link, not ratios: on a busy machine a
    # descheduled rank inflates the unlimited round trips as well.
    assert cross_after > 0.5 * floor
    assert cross_after - cross_before > 0.5 * floor
    assert local_after < cross_after - 0.5 * floor  # the limit is on the link, not on the host
