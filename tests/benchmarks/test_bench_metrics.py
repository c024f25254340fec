"""Benchmark arithmetic: a wrong percentile misreports every latency figure the project publishes."""

import math
import random

import pytest

from benchmarks.metrics import count_statuses, drift, percentile, summarize_latencies, wilson_interval


@pytest.mark.parametrize("values, q, expected", [
    ([1, 2, 3, 4, 5], 50, 3), ([1, 2, 3, 4], 50, 2.5), ([10], 99, 10), ([1, 2, 3, 4, 5], 0, 1),
    ([1, 2, 3, 4, 5], 100, 5), ([5, 1, 4, 2, 3], 25, 2), (list(range(101)), 95, 95), ([0, 10], 90, 9),
])
def test_percentile(values, q, expected):
    assert percentile(values, q) == pytest.approx(expected)


def test_a_long_list_gives_the_very_percentile_a_sort_gives():
    # Past 100,000 values the ranks come from a partition (a simulation's queueing times): the same
    # floats, to the bit, as the closest ranks of the sorted list, ties and repeats included.
    rng = random.Random(7)
    values = [round(rng.expovariate(1.0), 3) for _ in range(150_001)] + [0.0] * 20_000
    ordered = sorted(values)
    for q in (0, 0.1, 50, 95, 99, 99.99, 100):
        rank = (len(ordered) - 1) * q / 100
        low, high = math.floor(rank), math.ceil(rank)
        assert percentile(values, q) == ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def test_percentile_edges():
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_summary_and_counts():
    s = summarize_latencies([10.0, 20.0, 30.0, 40.0])
    assert (s["n"], s["mean_ms"], s["p50_ms"], s["max_ms"]) == (4, 25.0, 25.0, 40.0)
    assert math.isnan(summarize_latencies([])["p50_ms"])
    assert count_statuses([200, 200, 503, "timeout"]) == {"200": 2, "503": 1, "timeout": 1}


def test_drift():
    assert drift(100, 150) == 1.5 and math.isnan(drift(0, 5)) and math.isnan(drift(math.nan, 1))


def test_wilson_interval_matches_known_values_and_never_collapses():
    """A published accuracy's interval: the textbook value at 8/10, and a real width at 0 and n."""
    low, high = wilson_interval(8, 10)
    assert (round(low, 3), round(high, 3)) == (0.490, 0.943)
    assert wilson_interval(0, 400)[0] == 0.0 and 0 < wilson_interval(0, 400)[1] < 0.02
    assert wilson_interval(400, 400)[1] == 1.0 and 0.98 < wilson_interval(400, 400)[0] < 1.0
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
