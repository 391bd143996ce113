from bno_hvd.allocation.throughput import StepWindow


def test_ops_is_ratio_of_sums_over_window():
    w = StepWindow(size=2)
    assert w.ops() is None
    w.add(10, 1.0)
    w.add(30, 1.0)
    assert w.ops() == 20.0
    w.add(40, 2.0)  # evicts the first pair
    assert w.ops() == 70 / 3
    w.add(0, 1.0)  # ignored: no samples
    assert len(w) == 2
