"""The Balancer's parts in their own homes (issue 24): the step clock, the binding CPU limit, the
lab's plugin as the only way lab flags enter a run, and the config's validation table."""

import dataclasses
import gc
import os
import threading
import time
import warnings

import pytest

from bno_hvd.common.errors import UsageError
from bno_hvd.library.timing import RunQueue, StepTimer
from bno_hvd.processes.cpulimit import BindingLimit
from bno_hvd.training.components import make_plugin
from bno_hvd.training.config import FIELD_RULES, TrainConfig
from bno_hvd.training.hooks import NO_HETEROGENEITY, Plugin


def test_the_step_clock_splits_an_update_into_gap_compute_and_sync():
    timer = StepTimer(window=4)
    timer.done()  # the previous update ended here
    time.sleep(0.02)  # getting the batch
    timer.start()
    time.sleep(0.03)  # forward and backward
    compute = timer.end_compute(batch=8)
    time.sleep(0.01)  # the allreduce
    stats = timer.end(update=5, batch_sizes=[8, 8])
    assert compute >= 0.03 and stats.compute_seconds == compute
    assert stats.gap_seconds >= 0.02 and stats.sync_seconds >= 0.01
    assert stats.update == 5 and stats.batch_sizes == [8, 8]
    ((batch, local),) = timer.steps.samples()  # what the fits see: compute plus the gap before it
    assert batch == 8 and local == pytest.approx(compute + stats.gap_seconds)
    assert timer.syncs[-1] == (5, stats.sync_seconds) and timer.sync_cpu() is not None


def test_a_wait_for_the_other_ranks_inside_compute_is_sync_not_compute():
    """Exact BatchNorm waits for every rank at each layer: that wait moves from the compute phase (what
    the fits see) to the sync phase, or each rank would measure the slowest rank's compute."""
    timer = StepTimer(window=4, schedstat=False)
    outer = time.perf_counter()
    timer.start()
    inner = time.perf_counter()
    time.sleep(0.02)  # forward up to the layer
    t = time.perf_counter()
    time.sleep(0.05)  # the layer's allreduce: waiting for a slower rank
    waited = time.perf_counter() - t
    timer.waited(waited)
    time.sleep(0.02)  # the rest of forward and backward
    before = time.perf_counter()
    compute = timer.end_compute(batch=8)
    after = time.perf_counter()
    stats = timer.end(update=0, batch_sizes=[8, 8])
    assert before - inner - waited <= compute <= after - outer - waited  # the wall time less the wait
    assert stats.compute_seconds == compute and stats.sync_seconds >= waited
    ((batch, local),) = timer.steps.samples()
    assert local == pytest.approx(compute + stats.gap_seconds)
    assert timer.cycles[-1][1] >= before - inner  # the update's whole time is kept


def test_a_cpu_limit_counts_once_it_binds_and_until_it_changes():
    limit = [0.5]
    binding = BindingLimit(read_limit=lambda: limit[0])
    assert binding.read([(0.1, 1.0)]) is None  # 0.1 of a core used under 0.5: it does not bind
    assert binding.read([(0.3, 1.0)]) == 0.5  # at least half of it used: it binds
    assert binding.read([(0.05, 1.0)]) == 0.5  # a rank held small waits: still the same limit
    limit[0] = 1.5
    assert binding.read([(0.05, 1.0)]) is None  # the limit changed and does not bind
    limit[0] = None
    assert binding.read([(0.9, 1.0)]) is None  # no limit at all


def test_a_limit_binds_by_the_compute_phase_not_by_the_waits_in_the_allreduce():
    # a rank whose compute runs into its limit, then waits asleep for slower ranks in the allreduce:
    # over the whole update it used little of the CPU, but its compute ran on it all the time. The
    # margins come from this run: on a loaded machine the compute gets less than a core (7% of
    # one in a CI run), so the limit is what it got (at most 0.3), and the wait is 3x its wall time
    timer = StepTimer(window=4, schedstat=False)
    for update in range(2):
        timer.start()
        began, wall = time.process_time(), time.perf_counter()
        while time.process_time() - began < 0.02:  # compute: on a CPU whenever it can be
            pass
        timer.end_compute(batch=8)
        time.sleep(max(0.2, 3 * (time.perf_counter() - wall)))  # the allreduce: waiting for the others
        timer.end(update=update, batch_sizes=[8])
    compute_cpu, compute_wall = (sum(x) for x in zip(*timer.compute_use))
    limit = min(0.3, compute_cpu / compute_wall)
    whole_cpu, whole_wall = (sum(x) for x in zip(*timer.cpu_use))
    assert whole_cpu / whole_wall < 0.5 * limit and len(timer.compute_use) == 2
    assert BindingLimit(read_limit=lambda: limit).read(timer.cpu_use) is None  # the update: under half of it
    assert BindingLimit(read_limit=lambda: limit).read(timer.compute_use) == limit  # its compute: it binds


def test_lab_flags_need_the_lab_plugin():
    assert make_plugin(TrainConfig(), 4).label == NO_HETEROGENEITY
    for flags in ({"emulate_speed": (1.0, 0.5)}, {"cpu_quota": (0.5, 0.5)}, {"inject_fault": "kill:0:3"}):
        with pytest.raises(UsageError, match="needs the lab's plugin"):
            make_plugin(TrainConfig(**flags), 2)
    seen = []
    assert isinstance(make_plugin(TrainConfig(cpu_quota=(0.5,)), 1, lambda cfg, n: seen.append(n) or Plugin()), Plugin)
    assert seen == [1]


def test_the_validation_table_names_real_fields_and_refuses_with_one_line():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert {rule.name for rule in FIELD_RULES} <= fields
    with pytest.raises(UsageError, match=r"^--batch-sizes must all be positive integers, got 3,0$"):
        TrainConfig(batch_sizes=(3, 0))
    with pytest.raises(UsageError, match=r"^--collectives 'tcp': use auto or mpi or gloo$"):
        TrainConfig(collectives="tcp")
    with pytest.raises(UsageError, match="--allocation-lag 2 is too small"):
        TrainConfig(num_workers=1, allocation_lag=2)


def test_a_wait_for_the_device_counts_as_compute_but_not_in_the_cpu_share():
    # a GPU rank waits for its queue in sync(); a slower device waits longer: not CPU starvation
    # (where the kernel keeps no schedstat; where it does, a wait is not runnable time either)
    timer = StepTimer(window=4, schedstat=False, sync=lambda: time.sleep(0.05))
    timer.start()
    compute = timer.end_compute(batch=8)
    stats = timer.end(update=0, batch_sizes=[8])
    assert compute >= 0.05
    cpu, wall = timer.cpu_use[-1]
    assert wall == pytest.approx(stats.compute_seconds + stats.sync_seconds) and timer.idles[-1] >= 0.05
    assert timer.cpu_share() == pytest.approx(cpu / (wall - timer.idles[-1]))
    plain = StepTimer(window=4)  # the same wait, not told: all of it is wall time
    plain.start()
    time.sleep(0.05)
    plain.end_compute(batch=8)
    plain.end(update=0, batch_sizes=[8])
    assert plain.cpu_use[-1][1] >= 0.05 and plain.idles[-1] == 0


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="no /proc/self/task")
def test_the_run_queue_reads_every_thread_and_closes_the_files_of_threads_that_ended():
    queue = RunQueue()  # read every update: each thread's schedstat stays open and is re-read
    stop = threading.Event()
    worker = threading.Thread(target=lambda: stop.wait(5))
    worker.start()
    cpu = time.process_time()
    while time.process_time() - cpu < 0.05:  # CPU time, not wall time: the same on a busy machine
        pass
    used = time.process_time() - cpu
    ran, waited = queue.read()
    assert ran >= 0.9 * used and waited >= 0
    assert str(worker.native_id) not in queue._fds  # listed again every RELIST reads, not at each
    for _ in range(RunQueue.RELIST - 1):
        queue.read()
    kept = queue._fds[str(worker.native_id)]
    stop.set()
    worker.join()
    t = time.perf_counter()  # the kernel lists a joined thread until it has fully exited
    while str(worker.native_id) in os.listdir("/proc/self/task") and time.perf_counter() - t < 10:
        time.sleep(0.01)
    queue.read()
    assert str(worker.native_id) not in queue._fds and not is_open(kept)


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="no /proc/self/task")
def test_the_run_queue_closes_its_files_when_it_is_dropped_and_warns_of_nothing():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        queue = RunQueue()
        queue.read()
        fds = list(queue._fds.values())
        assert fds and all(is_open(fd) for fd in fds)
        queue.me = queue  # garbage only a collection frees (a run that failed in its setup)
        del queue
        gc.collect()
        assert not any(is_open(fd) and os.readlink(f"/proc/self/fd/{fd}").endswith("schedstat") for fd in fds)
        closing = RunQueue()
        closing.read()
        fds = list(closing._fds.values())
        closing.close()
        assert not any(is_open(fd) and os.readlink(f"/proc/self/fd/{fd}").endswith("schedstat") for fd in fds)
        closing.close()  # twice is harmless
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_the_step_clock_counts_the_garbage_collectors_time_in_the_update():
    timer = StepTimer(window=4, schedstat=False)
    timer.done()
    timer.start()
    cycles = []
    for _ in range(20000):  # garbage only a collection frees
        a = []
        a.append(a)
        cycles.append(a)
    del cycles, a
    t = time.perf_counter()
    gc.collect()
    collecting = time.perf_counter() - t
    timer.end_compute(batch=8)
    stats = timer.end(update=0, batch_sizes=[8])
    assert collecting * 0.5 <= stats.gc_seconds <= stats.compute_seconds
    assert stats.rank_step(8).gc == stats.gc_seconds
    timer.done()
    timer.start()  # the next update collects nothing
    timer.end_compute(batch=8)
    assert timer.end(update=1, batch_sizes=[8]).gc_seconds < collecting * 0.5
