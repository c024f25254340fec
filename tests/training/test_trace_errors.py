"""training.probes.trace_errors: a trace's first wrong word is classed by the step that wrote it."""

from tasks.grid import grid_item, grid_items
from training.probes.trace_errors import first_wrong

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


def test_count_answers_are_placed_by_how_far_they_land_from_the_count():
    from tasks.datasets import LETTERS
    from training.probes.trace_errors import offsets

    items = [it for it in grid_items(80, seed=0) if it.tier == "count"][:4]
    truth = [int(it.options[LETTERS.index(it.answer)]) for it in items]
    # exact; one over; the right option's letter; not a number
    texts = [str(truth[0]), f"{truth[1] + 1}.", items[2].answer, "red"]
    assert offsets(items, texts) == {"0": 2, "1": 1, "other": 1}


def test_the_options_rule_separates_reading_the_options_from_counting():
    from tasks.datasets import LETTERS
    from training.probes.trace_errors import options_rule, rule_share

    items = [it for it in grid_items(400, seed=0) if it.tier == "count"][:40]
    truth = [it.options[LETTERS.index(it.answer)] for it in items]
    rules = [options_rule(it) for it in items]
    assert all(r in it.options for r, it in zip(rules, items))
    assert 0 < sum(r == t for r, t in zip(rules, truth)) < len(items)  # fair options: right by chance only
    counted = rule_share(items, truth)  # a model that counts
    assert counted["answer_is_rule"] == counted["rule_right"]
    assert counted["right_where_rule_wrong"] == counted["rule_wrong"] == sum(r != t for r, t in zip(rules, truth))
    leaning = rule_share(items, rules)  # a model that reads the options
    assert leaning["answer_is_rule"] == len(items) and leaning["right_where_rule_wrong"] == 0


def test_a_census_answer_is_scored_per_colour_by_name():
    from training.probes.trace_errors import census_counts

    gold = "blue 3, red 5, white 8."
    assert census_counts(gold, gold) == (2, 2, 0)
    assert census_counts(gold, "red 5, blue 4, white 7.") == (2, 1, 1)  # any order; one off is not right
    assert census_counts(gold, "row 1: red red blue white.") == (2, 0, 0)  # a caption counts nothing
