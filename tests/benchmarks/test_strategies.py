"""The strategies benchmark's measurement plan: rows interleaved item by item, so two rows' latencies
are taken under the same machine load (F3 compares two rows' p50s)."""

from tasks.datasets import Item
from benchmarks.metrics import percentile
from benchmarks.strategies import findings, measure, row


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


def _runs(correct_by_tier: dict[str, tuple[int, int]], latency_ms: float = 10.0) -> list[dict]:
    """Records for one row: per tier, (right, of n)."""
    return [{"correct": i < right, "tier": tier, "latency_ms": latency_ms, "tokens": {}, "path": "", "transferred": 0}
            for tier, (right, n) in correct_by_tier.items() for i in range(n)]


def test_f3_reports_the_gap_it_divides_by_and_whether_that_gap_is_inside_the_interval():
    """F3's ratio divides by large_reasoning − large; with a 2-point gap the ratio is large and
    means little, so the findings say how big the gap is and whether it is inside large_reasoning's
    95 % interval (the shipped pair's case), and the bars themselves do not move."""
    from benchmarks.strategies import findings, row

    def evaluate(large_right):
        per_tier = lambda right: {"perceive": (right, 100), "compose": (right, 100)}  # noqa: E731
        runs = {"small_direct": _runs(per_tier(50)), "small": _runs(per_tier(95), 80.0),
                "large": _runs(per_tier(large_right)), "large_reasoning": _runs(per_tier(78), 100.0),
                "mutual": _runs(per_tier(91), 40.0), "always": _runs(per_tier(94), 85.0)}
        return findings(runs, {name: row(name, r) for name, r in runs.items()})["F3"]

    near = evaluate(76)
    assert near["gap_large_reasoning_minus_large"] == 0.02 and near["gap_recovered"] == 7.5
    assert near["gap_inside_large_reasoning_ci95"] is True
    far = evaluate(50)
    assert far["gap_large_reasoning_minus_large"] == 0.28 and far["gap_inside_large_reasoning_ci95"] is False


def test_a_dataset_without_the_grid_tiers_has_no_findings_and_no_crash():
    """`strategies --quick` runs the synthetic set, whose items carry no tier: the findings, stated
    on the grid task's tiers, are left out instead of failing on an empty tier."""
    runs = {name: _runs({None: (5, 10)}) for name in ("small_direct", "small", "large", "large_reasoning",
                                                      "mutual", "always")}
    assert findings(runs, {name: row(name, r) for name, r in runs.items()}) == {}
