"""An elastic job across two hosts, and one host lost: network namespaces on a bridge
(tests/support/netns.py), an agent of ``bno-hvd elastic`` in each, two workers each, Gloo over
the hosts' own addresses (nothing else routes between them). The whole of host 1 dies at once
(SIGKILL to every process in its namespace: its agent and its workers, as a machine that fails),
and the job goes on with host 0's workers: exit 0, the ledger check passes, and the final
parameters equal one process on the same global batches while the split changes at every update.
Then a new agent on host 1 joins, as a machine lent again: its workers join the job
at an update boundary. Node 0's agent lost instead: the other agent ends its workers and exits 1 with one line."""

import os
import signal
import subprocess
import sys
import time

import pytest
from support.checks import max_relative_difference
from support.elastic_jobs import GLOBAL, committed, reference
from support.jobs import ROOT, kill_tree, mpi_env, run_cli
from support.netns import NetnsCluster, NetnsError, run, unavailable_reason
from support.train_runs import saved_model, train_args
from test_ddp_elastic import data, one_process, script_command  # noqa: F401 - the fixtures

pytestmark = [pytest.mark.mpi, pytest.mark.root]

UPDATES = 400  # about 25 per second on this machine: time for a new agent to start and join
PORT = 29400  # node 0's store, in host 0's own network namespace


@pytest.fixture(scope="module")
def hosts():
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    net = NetnsCluster(f"bne{os.getpid() % 100000}", subnet="10.213.9", hosts=2)
    try:
        net.create()
    except (NetnsError, subprocess.TimeoutExpired):
        left = net.destroy()
        assert not left, f"left behind: {left}"
        raise
    yield net
    left = net.destroy()
    assert not left, f"left behind: {left}"


def start_agent(net, tmp_path, data_dir, host: int, node: int, args=None) -> subprocess.Popen:
    """Node ``node``'s agent on host ``host``, two workers; Gloo on the host's own link
    (GLOO_SOCKET_IFNAME). ``args``: the workers' command (default: ``bno-hvd train --elastic``)."""
    flags = ["--engine", "torch", "--data-dir", data_dir, "--global-batch", str(GLOBAL), "--strategy", "random"]
    flags += ["--rebalance-every", "1", "--elastic-timeout", "5"]
    args = args or train_args(tmp_path / "elastic.pt", tmp_path / "log", *flags, updates=UPDATES)
    cmd = ["ip", "netns", "exec", net.namespaces[host], sys.executable, "-m", "bno_hvd", "elastic", "-n", "2"]
    cmd += ["--nnodes", "2", "--node-rank", str(node), "--store", f"{net.addresses[0]}:{PORT}", "--timeout", "200"]
    env = mpi_env({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": f"{net.host_links[host]}n"})
    err = open(tmp_path / f"agent{node}.err", "w")
    return subprocess.Popen([*cmd, "--", *args], stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT)


def start_agents(net, tmp_path, data_dir, args=None) -> list[subprocess.Popen]:
    return [start_agent(net, tmp_path, data_dir, host, host, args) for host in range(2)]


def kill_host(net, host: int) -> None:
    """Every process in the host's namespace, at once: the machine fails."""
    for pid in run("ip", "netns", "pids", net.namespaces[host], check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(predicate, limit: float) -> bool:
    end = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def finish(agents, limit: float = 240) -> list[int]:
    codes = []
    for proc in agents:
        try:
            codes.append(proc.wait(timeout=limit))
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            codes.append(None)
    return codes


def lose_host_1_then_one_joins(net, tmp_path, data_dir, args=None) -> str:
    """Two agents; once 40 updates are committed, host 1 dies whole; when node 0's agent has seen it,
    a new agent on host 1 (node 2: a machine lent again) joins with two workers. Both agents left
    must exit 0; returns node 0's agent's stderr."""
    agents = start_agents(net, tmp_path, data_dir, args)
    try:
        assert wait_for(lambda: len(committed(tmp_path / "log")) >= 40, 180), "the job did not get going"
        kill_host(net, 1)
        assert wait_for(lambda: "ended (node 1 lost)" in (tmp_path / "agent0.err").read_text(), 60), "no loss seen"
        agents.append(start_agent(net, tmp_path, data_dir, 1, 2, args))
        codes = finish(agents)
    finally:
        for proc in agents:
            kill_tree(proc)
    err = (tmp_path / "agent0.err").read_text()
    assert codes[0] == 0 and codes[2] == 0, f"{codes}\n{err[-3000:]}"
    return err


@pytest.mark.alone  # a lost host is told by its silence: no other test's load beside it
def test_a_job_loses_a_host_then_one_joins_and_its_update_stays_exact(hosts, tmp_path, fashion_dir, tmp_path_factory):
    """Host 1 dies whole; then a new agent on host 1 (node 2: a machine lent again) joins with two workers."""
    one = saved_model(reference(tmp_path_factory.mktemp("hosts-one"), fashion_dir, UPDATES))
    err = lose_host_1_then_one_joins(hosts, tmp_path, fashion_dir)
    log = tmp_path / "log"
    check = run_cli("ledger", "check", str(log))
    assert check.returncode == 0, f"{check.stderr}\n{err[-3000:]}"
    assert check.stdout.startswith(f"ledger ok: {UPDATES} updates used {UPDATES * GLOBAL} samples"), check.stdout
    sizes = [len(e["members"]) for e in committed(log)]
    assert sizes[0] == 4 and 2 in sizes and sizes[-1] == 4, sorted(set(sizes))  # 4, then 2, then 4 again
    entries = committed(log)
    assert any(1 in e["sizes"] for e in entries), "no rank ever had a single sample"
    diff = max_relative_difference(saved_model(tmp_path / "elastic.pt"), one)
    assert diff <= 1e-10, f"max relative difference {diff:.3e}\n{err[-3000:]}"


@pytest.mark.alone
def test_a_script_of_bno_elastic_loses_a_host_then_one_joins_and_stays_exact(hosts, tmp_path, data, one_process):  # noqa: F811
    """The same on the script path: ``examples/ddp_elastic.py`` (``bno.elastic``) as each agent's
    workers, 3 epochs of 2000 samples (375 updates); equal to the plain port in one process."""
    (tmp_path / "out").mkdir()
    command = script_command(tmp_path / "out", data, 3, tmp_path / "log")
    err = lose_host_1_then_one_joins(hosts, tmp_path, data, command)
    log = tmp_path / "log"
    check = run_cli("ledger", "check", str(log))
    assert check.returncode == 0 and check.stdout.startswith("ledger ok: 375 updates"), f"{check}\n{err[-3000:]}"
    sizes = [len(e["members"]) for e in committed(log)]
    assert sizes[0] == 4 and 2 in sizes, sorted(set(sizes))  # 4, then 2 (then 4 again, if the join came in time)
    lost = sizes.index(2)
    print(f"members per update: 4 x {lost}, 2 x {sizes.count(2)}, 4 again x {sizes[lost:].count(4)}")
    diff = max_relative_difference(saved_model(tmp_path / "out" / "model.pt"), one_process(3))
    assert diff <= 1e-10, f"max relative difference {diff:.3e}\n{err[-3000:]}"


def test_the_other_hosts_agent_ends_when_node_0_is_lost(hosts, tmp_path, fashion_dir):
    agents = start_agents(hosts, tmp_path, fashion_dir)
    try:
        assert wait_for(lambda: len(committed(tmp_path / "log")) >= 5, 180), "the job did not get going"
        kill_host(hosts, 0)
        codes = finish(agents[1:], limit=120)
    finally:
        for proc in agents:
            kill_tree(proc)
    err = (tmp_path / "agent1.err").read_text()
    assert codes == [1], err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("bno-hvd elastic: error")]
    assert lines and "node 1 lost the job's store" in lines[0], err[-3000:]
    left = run("ip", "netns", "pids", hosts.namespaces[1], check=False).stdout.split()
    assert not left, f"processes left on host 1: {left}"
