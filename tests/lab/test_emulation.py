import json
import time
from types import SimpleNamespace

import pytest

from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import RankSchedule
from bno_hvd.lab.emulation import DeviceEmulator, EmulationHook, load_schedule, parse_speeds
from bno_hvd.library.timing import StepTimer


def test_parse_speeds():
    assert parse_speeds("1,1,1,0.33", 4) == [1, 1, 1, 0.33]
    for bad in ("1,0", "1,-2", "a,b", "1,inf", ""):
        with pytest.raises(UsageError):
            parse_speeds(bad)
    with pytest.raises(UsageError, match="3 entries but the job has 4 ranks"):
        parse_speeds("1,1,1", 4)


def test_target_and_pre_wait():
    emu = DeviceEmulator(rank=3, rate=200.0, schedule=RankSchedule.constant([1, 1, 1, 0.25]))
    assert emu.target_seconds(50, 0) == pytest.approx(1.0)
    assert emu.pre_wait(50, 0) == pytest.approx(1.0)  # nothing learned yet
    emu.record_real(50, 0.1, 0)
    assert emu.pre_wait(50, 0) == pytest.approx(0.9)
    emu.record_real(50, 2.0, 0)
    assert emu.overruns == 1


def test_schedule_changes_speed(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"update": 200, "speeds": [1, 0.5]}, {"update": 0, "speeds": [1, 1]}]))
    sched = load_schedule(str(path), 2)
    emu = DeviceEmulator(rank=1, rate=100.0, schedule=sched)
    assert emu.speed(199) == 1 and emu.speed(200) == 0.5


@pytest.mark.parametrize(
    "content,msg",
    [
        ("not json", "not valid JSON"),
        ("[]", "expected a JSON list"),
        ('[{"update": 5, "speeds": [1, 1]}]', "first entry must be at update 0"),
        ('[{"update": 0, "speeds": [1]}]', "1 entries but the job has 2 ranks"),
        ('[{"update": 0}]', "needs keys"),
    ],
)
def test_bad_schedules(tmp_path, content, msg):
    path = tmp_path / "s.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=msg):
        load_schedule(str(path), 2)
    with pytest.raises(UsageError, match="cannot read"):
        load_schedule(str(tmp_path / "missing.json"), 2)


def test_the_emulated_wait_is_the_devices_time_not_cpu_starvation():
    # a rank at speed 0.25 sleeps most of its step: its timer counts the sleep as compute, but
    # not as wall time in its CPU share, or a sit-out trial would read it as CPU-starved (where
    # the kernel keeps no schedstat; where it does, a sleep is not runnable time: test_cpuquota)
    timer = StepTimer(window=4, schedstat=False)
    hook = EmulationHook(DeviceEmulator(rank=1, rate=100.0, schedule=RankSchedule.constant([1, 0.25])))
    hook.start(SimpleNamespace(balancer=SimpleNamespace(timer=timer)))
    step = SimpleNamespace(batch_size=5, update=0, emulated_work=None, work=None)
    timer.start()
    hook.before_compute(step)
    t = time.process_time()
    while time.process_time() - t < 0.02:  # the real compute: CPU all the time
        pass
    hook.after_compute(step)
    compute = timer.end_compute(5)
    stats = timer.end(update=0, batch_sizes=[5, 5])
    assert compute >= 0.2  # 5 samples at 25 samples/s: the emulated compute phase
    cpu, wall = timer.cpu_use[-1]
    # the share's wall time is the update's less the sleeps (at least 0.2 - 0.02 s of them); the
    # whole wall time stays in cpu_use (a device wait does not run into a CPU limit)
    assert wall == pytest.approx(stats.compute_seconds + stats.sync_seconds) and timer.idles[-1] >= 0.17
    assert timer.cpu_share() == pytest.approx(cpu / (wall - timer.idles[-1]))
    # what it was before (the sleep counted as wall time) is less by the sleep's part of the wall time,
    # whatever else the update waited for (on a busy machine the 0.02 s of CPU can take a second)
    assert timer.cpu_share() > cpu / wall * (1 + 0.5 * timer.idles[-1] / wall)
    # without the hook's start (no run: a unit of the lab alone) nothing is told, nothing fails
    EmulationHook(DeviceEmulator(rank=0, rate=1000.0, schedule=RankSchedule.constant([1]))).before_compute(step)
