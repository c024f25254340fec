"""The strategies benchmark's measurement plan: rows interleaved item by item, so two rows' latencies
are taken under the same machine load (F3 compares two rows' p50s)."""

from benchmarks.datasets import Item
from benchmarks.metrics import percentile
from benchmarks.strategies import measure


def _items(n):
    return [Item(question=f"q{i}", options=("a", "b"), answer="A", image=b"", tier="perceive") for i in range(n)]


def test_each_item_goes_through_every_row_in_turn_the_order_rotating():
    calls = []

    def row(name):
        def one(item, i):
            calls.append((i, name))
            return {"item": item.question, "i": i}
        return one

    items = _items(4)
    runs = measure(items, {n: row(n) for n in "abc"}, progress=False)
    assert calls == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"),
                     (2, "c"), (2, "a"), (2, "b"), (3, "a"), (3, "b"), (3, "c")]
    assert all(runs[n] == [{"item": f"q{i}", "i": i} for i in range(4)] for n in "abc")  # item order kept


def test_interleaving_cancels_a_drifting_machine_that_rows_in_sequence_do_not():
    """Two identical rows on a machine that slows down with every call: in sequence the second row's
    p50 is far above the first's; interleaved the two are measured alike."""
    clock = {"calls": 0}

    def same_work(_item, _i):
        clock["calls"] += 1
        return {"latency_ms": 100 + clock["calls"]}  # the machine drifts: each call a little slower

    def p50_ratio(interleave):
        clock["calls"] = 0
        runs = measure(_items(200), {"x": same_work, "y": same_work}, interleave=interleave, progress=False)
        p50 = {k: percentile([r["latency_ms"] for r in rs], 50) for k, rs in runs.items()}
        return p50["y"] / p50["x"]

    assert p50_ratio(interleave=False) > 1.3
    assert abs(p50_ratio(interleave=True) - 1) < 0.01
