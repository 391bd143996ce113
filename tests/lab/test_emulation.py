import json

import pytest

from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import RankSchedule
from bno_hvd.lab.emulation import DeviceEmulator, load_schedule, parse_speeds


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
