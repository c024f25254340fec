"""benchmarks.trace_errors: a trace's first wrong word is classed by the step that wrote it."""

from benchmarks.grid import grid_item
from benchmarks.trace_errors import first_wrong

COMPOSE = "row 2: blue 9 (9) orange 7 (6) blue 9 (5) blue 9 (4). total 4."


def test_each_step_of_a_trace_is_named_where_it_first_goes_wrong():
    assert first_wrong(COMPOSE, COMPOSE) is None
    assert first_wrong(COMPOSE, COMPOSE.replace("orange 7 (6)", "orange 9 (8)")) == "value"
    assert first_wrong(COMPOSE, COMPOSE.replace("orange 7 (6)", "orange 7 (7)")) == "sum"
    assert first_wrong(COMPOSE, COMPOSE.replace("orange", "green")) == "colour"
    assert first_wrong(COMPOSE, COMPOSE[:30]) == "end"
    assert first_wrong(COMPOSE, COMPOSE.replace("total", "sum")) == "total"


def test_the_programs_own_traces_are_right_to_the_end():
    for seed in range(30):
        item = grid_item(seed)
        assert first_wrong(item.trace, item.trace) is None
