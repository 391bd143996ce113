"""Metrics file: every bad input is one UsageError naming the problem; 4096 ranks stay cheap."""

import json
import time

import numpy as np
import pytest

from bno_hvd.allocation import (
    ClusterMetrics,
    UsageError,
    bno_batch_sizes,
    load_metrics_file,
    make_strategy,
    metrics_to_json,
)

GOOD = {
    "ops": [100.0, 100.0, 100.0, 33.0],
    "memory_used": [2.0, 2.0, 4.0, 8.0],
    "latency": [[0, 1e-3, 1e-3, 1e-3], [1e-3, 0, 1e-3, 1e-3], [1e-3, 1e-3, 0, 1e-3], [1e-3, 1e-3, 1e-3, 0]],
}


def write(tmp_path, data, raw=None):
    path = tmp_path / "metrics.json"
    path.write_text(raw if raw is not None else json.dumps(data))
    return path


def with_(**changes):
    data = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    return data


def test_good_file_loads_and_feeds_bno(tmp_path):
    m = load_metrics_file(write(tmp_path, GOOD))
    assert m.n == 4 and m.max_batch == [None] * 4 and m.compute_samples == [[], [], [], []]
    assert bno_batch_sizes(m.ops, m.memory_used, m.latency, 64) == [46, 46, 43, 34]


def test_round_trip_with_optional_fields(tmp_path):
    m = ClusterMetrics(
        ops=[10.0, None],
        memory_used=[1.0, 2.0],
        latency=[[0, 2e-4], [2e-4, 0]],
        compute_samples=[[(16, 0.5)], []],
        max_batch=[None, 64],
        sync_cpu=[0.004, None],
        cpu_limit=[None, 0.17],
        cpu_period=[None, 0.01],
    )
    back = load_metrics_file(write(tmp_path, metrics_to_json(m)))
    assert metrics_to_json(back) == metrics_to_json(m)
    assert back.ops == [10.0, None] and back.max_batch == [None, 64]
    assert back.compute_samples == [[(16, 0.5)], []]
    assert back.sync_cpu == [0.004, None] and back.cpu_limit == [None, 0.17] and back.cpu_period == [None, 0.01]


def test_small_asymmetry_within_tolerance_is_accepted(tmp_path):
    lat = [[0, 1.0e-4], [1.4e-4, 0]]
    m = load_metrics_file(write(tmp_path, {"ops": [1, 1], "memory_used": [1, 1], "latency": lat}))
    assert m.latency[1][0] == 1.4e-4


BAD = [
    ("unreadable", None, "cannot read"),
    ("malformed", '{"ops": [1,', "not valid JSON"),
    ("not an object", "[1, 2]", "JSON object"),
    ("missing key", with_(latency=None), "lacks 'latency'"),
    ("unknown key", with_(flops=[1, 2, 3, 4]), "unknown key 'flops'"),
    ("ops not a list", with_(ops=5), "'ops' must be a JSON list"),
    ("ops empty", {"ops": [], "memory_used": [], "latency": []}, "'ops' is empty"),
    ("ops string", with_(ops=[1, "fast", 1, 1]), 'ops[1] is "fast"'),
    ("ops bool", with_(ops=[1, True, 1, 1]), "ops[1] is true"),
    ("memory length", with_(memory_used=[1, 2, 3]), "'memory_used' has 3 entries"),
    ("memory null", with_(memory_used=[1, None, 3, 4]), "memory_used[1] is null"),
    ("latency rows", with_(latency=[[0, 1], [1, 0]]), "list of 4 rows"),
    (
        "latency not square",
        with_(latency=[[0, 1, 1, 1], [1, 0, 1, 1], [1, 1, 0], [1, 1, 1, 0]]),
        "latency row 2 has 3 entries",
    ),
    (
        "latency string",
        with_(latency=[[0, 1, 1, 1], [1, 0, "a", 1], [1, 1, 0, 1], [1, 1, 1, 0]]),
        'latency[1][2] is "a"',
    ),
    (
        "ops NaN literal",
        '{"ops": [1, 1, NaN, 1], "memory_used": [1, 1, 1, 1], "latency": ' + json.dumps(GOOD["latency"]) + "}",
        "ops[2] is nan",
    ),
    (
        "latency Infinity literal",
        '{"ops": [1, 1], "memory_used": [1, 1], "latency": [[0, Infinity], [1, 0]]}',
        "latency[0][1] is inf",
    ),
    (
        "memory Infinity",
        '{"ops": [1, 1], "memory_used": [1, Infinity], "latency": [[0, 1], [1, 0]]}',
        "memory_used[1] is inf",
    ),
    ("negative ops", with_(ops=[1, 1, -3, 1]), "ops[2] is -3.0"),
    ("negative memory", with_(memory_used=[1, -5, 1, 1]), "memory_used[1] is -5.0"),
    (
        "negative latency",
        {"ops": [1, 1], "memory_used": [1, 1], "latency": [[0, -1], [-1, 0]]},
        "latency[0][1] is -1.0",
    ),
    ("diagonal", {"ops": [1, 1], "memory_used": [1, 1], "latency": [[0, 1], [1, 0.5]]}, "latency[1][1] is 0.5"),
    ("asymmetric", {"ops": [1, 1], "memory_used": [1, 1], "latency": [[0, 0.010], [0.002, 0]]}, "asymmetric at [0][1]"),
    ("max_batch zero", with_(max_batch=[None, 0, None, None]), "max_batch[1] is 0"),
    ("max_batch fraction", with_(max_batch=[None, 2.5, None, None]), "max_batch[1] is 2.5"),
    ("max_batch length", with_(max_batch=[1, 2]), "'max_batch' has 2 entries"),
    ("samples pair", with_(compute_samples=[[[16]], [], [], []]), "compute_samples[0][0]"),
    ("samples length", with_(compute_samples=[[]]), "'compute_samples' must be a list of 4"),
    ("sync_cpu negative", with_(sync_cpu=[0.004, -1, None, None]), "sync_cpu[1] is -1"),
    ("sync_cpu length", with_(sync_cpu=[0.004]), "'sync_cpu' has 1 entries"),
    ("cpu_limit zero", with_(cpu_limit=[None, 0, None, None]), "cpu_limit[1] is 0"),
    ("cpu_limit string", with_(cpu_limit=[None, "half", None, None]), 'cpu_limit[1] is "half"'),
    ("cpu_period over 1 s", with_(cpu_period=[None, 2.0, None, None]), "cpu_period[1] is 2"),
]


@pytest.mark.parametrize("case,data,message", BAD, ids=[b[0] for b in BAD])
def test_bad_file_is_one_line_usage_error(tmp_path, case, data, message):
    if data is None:
        path = tmp_path / "missing.json"
    else:
        path = write(tmp_path, None, raw=data) if isinstance(data, str) else write(tmp_path, data)
    with pytest.raises(UsageError) as err:
        load_metrics_file(path)
    text = str(err.value)
    assert message in text
    assert "\n" not in text and str(path) in text


def generate(n, seed=0):
    """A random but valid cluster: symmetric latency (10 us - 2 ms), zero diagonal."""
    rng = np.random.default_rng(seed)
    micros = np.triu(rng.integers(10, 2000, size=(n, n)), 1)
    micros = micros + micros.T
    # Format via a lookup table: formatting 16.8M floats one by one would dominate the test.
    table = np.array([repr(k / 1e6) for k in range(2000)], dtype=object)
    rows = ",".join("[" + ",".join(row) + "]" for row in table[micros])
    ops = rng.uniform(50, 500, n).round(3).tolist()
    memory = rng.uniform(1e9, 8e9, n).round().tolist()
    return f'{{"ops": {json.dumps(ops)}, "memory_used": {json.dumps(memory)}, "latency": [{rows}]}}'


@pytest.mark.slow
def test_4096_rank_file_runs_bno_and_balanced(tmp_path):
    n, b = 4096, 32
    path = write(tmp_path, None, raw=generate(n))
    t0 = time.perf_counter()
    m = load_metrics_file(path)
    t1 = time.perf_counter()
    sizes = bno_batch_sizes(m.ops, m.memory_used, m.latency, b)
    t2 = time.perf_counter()
    s = make_strategy("balanced", n, b)
    balanced = s.rebalance(m, s.initial(), update=1)
    t3 = time.perf_counter()
    print(f"\n4096 ranks: load {t1 - t0:.2f}s, bno {t2 - t1:.3f}s, balanced {t3 - t2:.3f}s")
    assert len(sizes) == n and min(sizes) >= 1
    assert len(balanced) == n and min(balanced) >= 1 and sum(balanced) == n * b
    # Faster ranks get more: balanced is monotone in ops up to rounding and latency offsets.
    ops = np.asarray(m.ops)
    assert balanced[int(ops.argmax())] > balanced[int(ops.argmin())]


def test_sparse_latency_pairs_are_completed_symmetrically(tmp_path):
    # 4 ranks, a sampled probe: 0<->1 both ways (1 ms, 3 ms), 2->3 one way (4 ms), rest unmeasured
    path = tmp_path / "sparse.json"
    path.write_text(
        json.dumps(
            {
                "ops": [1, 1, 1, 1],
                "memory_used": [1, 1, 1, 1],
                "latency": {"pairs": [[0, 1, 0.001], [1, 0, 0.003], [2, 3, 0.004]]},
            }
        )
    )
    lat = load_metrics_file(str(path)).latency_array()
    assert lat[0, 1] == lat[1, 0] == pytest.approx(0.002)
    assert lat[2, 3] == lat[3, 2] == pytest.approx(0.004)
    assert lat[0, 2] == lat[3, 1] == pytest.approx(0.003)  # median of the measured pairs
    assert (lat.diagonal() == 0).all()
    for bad in ({"pairs": []}, {"pairs": [[0, 0, 0.1]]}, {"pairs": [[0, 9, 0.1]]}, {"pairs": [[0, 1, -1]]}):
        path.write_text(json.dumps({"ops": [1] * 4, "memory_used": [1] * 4, "latency": bad}))
        with pytest.raises(UsageError):
            load_metrics_file(str(path))
