"""Training examples: the models learn exactly the strings the pipeline sends (rendered by
tandem/prompts.py, tokenized as the engine tokenizes them), and the positions the auxiliary losses point at."""

import random
import re

import pytest

from tasks.grid import grid_item, grid_items, train_seed
from training.examples import FORMATS, build_task_tokenizer, render_example
from training.schedule import MIX
from tandem import prompts


@pytest.fixture(scope="module")
def tokenizer():
    return build_task_tokenizer(0)


@pytest.mark.parametrize("role", ["small", "large"])
def test_examples_are_the_pipelines_prompts(role, tokenizer):
    """A model trained on other strings than the pipeline's answers noise at serving time."""
    item, fmt, rng = grid_item(train_seed(0, 7), tier="compose"), FORMATS[role], random.Random(0)
    question = item.prompt()
    assert render_example(item, role, "direct", tokenizer, rng)[0] == prompts.direct_prompt(question, 1, fmt)
    prompt, target = render_example(item, role, "reason", tokenizer, rng)
    assert prompt == prompts.reasoning_prompt(question, 1, fmt)
    assert (prompt + target).startswith(prompts.answer_after_reasoning(prompt, item.trace, fmt))
    if "transfer" in MIX[role]:
        prompt, _ = render_example(item, role, "transfer", tokenizer, rng)
        head = prompts.transfer_prompt(question, 1, "", fmt).split(prompts.TRANSFER_HEADER)[0]
        assert prompt.startswith(head) and prompts.TRANSFER_HEADER in prompt


@pytest.mark.parametrize("role", ["small", "large"])
def test_training_tokens_match_what_the_engine_sends(role, tokenizer):
    """The second stage of reasoning sends prompt + reasoning + close as one string: its tokens must be
    a prefix of the training sequence, token for token (a prompt ending in a bare space is not)."""
    rng = random.Random(1)
    for item in grid_items(20, seed=0, split="train"):
        prompt, target = render_example(item, role, "reason", tokenizer, rng)
        trained = tokenizer(prompt)["input_ids"] + tokenizer(target)["input_ids"]
        stage_two = tokenizer(prompts.answer_after_reasoning(prompt, item.trace, FORMATS[role]))["input_ids"]
        assert trained[: len(stage_two)] == stage_two


def test_task_words_are_single_tokens(tokenizer):
    for word in (" red", " purple", " orange", "row", " column", " total", " yellow", " white"):
        assert len(tokenizer(word)["input_ids"]) == 1, word


def test_value_sums_are_written_as_compose_traces_and_are_right():
    """The lookup objective teaches the compose traces' copying and adding steps: every value must be
    the one the question lists for that colour, every running sum right modulo 10, the format the
    compose traces' own."""
    import re

    from training.examples import value_sum

    rng = random.Random(3)
    for _ in range(50):
        question, target = value_sum(rng)
        listed = {c: int(v) for c, v in re.findall(r"(\w+) (\d)\b", question.split("these")[0])}
        asked = question.split("colours: ")[1].split(". What")[0].split(", ")
        steps = re.findall(r"(\w+) (\d) \((\d)\)", target)
        assert [c for c, _, _ in steps] == asked and listed["white"] == 0
        total = 0
        for colour, value, running in steps:
            total = (total + listed[colour]) % 10
            assert int(value) == listed[colour] and int(running) == total
        assert target.endswith(f". total {total}.")


def test_row_tallies_copy_the_written_rows_and_count_them_right():
    """The tally objective teaches the count traces' counting step from rows given in the text: the
    rows the target reads must be the ones the question writes, each count recomputed here from the
    written row, the running count and total right."""
    import re

    from tasks.grid import grid_item
    from training.examples import row_tally

    rng = random.Random(4)
    for i in range(50):
        cells = grid_item(i).cells
        question, target = row_tally(cells, rng)
        written = re.findall(r"row \d: ([a-z ]+)\.", question)
        colour = question.split("How many ")[1].split(" cells")[0]
        steps = re.findall(r"row \d: ([a-z ]+); (\w+) (\d) \((\d+)\)", target)
        assert [row for row, *_ in steps] == written == [" ".join(r) for r in cells]
        running = 0
        for row, named, count, total in steps:
            running += row.split().count(colour)
            assert named == colour and int(count) == row.split().count(colour) and int(total) == running
        assert target.endswith(f" total {running}.") and running > 0  # the colour asked about is present


def test_a_census_counts_every_colour_of_the_grid():
    """The census objective: each colour the image shows, with its count recomputed here from the cells,
    and nothing the grid lacks."""
    from tasks.grid import grid_item
    from training.examples import census

    for i in range(50):
        cells = grid_item(i).cells
        named = dict(part.split() for part in census(cells).rstrip(".").split(", "))
        flat = [c for row in cells for c in row]
        assert named == {c: str(flat.count(c)) for c in set(flat)}


def test_pointers_name_the_cell_each_colour_word_reads():
    """The supervised attention points a colour word at the cell it reads: wrong cells would teach
    the look-up wrong. Every colour word of a caption, a trace and a colour question's answer."""
    from training.examples import pointed_cells

    rng = random.Random(0)
    seen = {}
    for i in range(30):
        item = grid_item(train_seed(0, i), tier=("perceive", "count", "compose")[i % 3])
        for objective in ("direct", "reason", "caption"):
            _, target = render_example(item, "large", objective, None, rng)
            points = pointed_cells(item, objective, target)
            for at, (r, c) in points:
                assert target[at:].startswith(item.cells[r - 1][c - 1]), (target, at, r, c)
            seen[objective, item.kind] = seen.get((objective, item.kind), 0) + len(points)
    assert seen["caption", "count"] > 0 and seen["reason", "count"] > 0 and seen["reason", "row_sum"] > 0
    assert seen["direct", "colour_at"] > 0 and seen["direct", "count"] == 0 and seen["direct", "row_sum"] == 0


def test_counted_cells_are_the_cells_each_number_counts():
    from training.examples import census, counted_cells

    rng = random.Random(1)
    checked = 0
    for i in range(30):
        item = grid_item(train_seed(0, i), tier="count")
        for objective in ("direct", "reason", "census"):
            target = census(item.cells) if objective == "census" else render_example(item, "large", objective, None, rng)[1]
            for at, cells in counted_cells(item, objective, target):
                number = target[at:].split()[0].split("<")[0].rstrip(".,;")
                if item.kind == "any" and objective == "direct":
                    assert number == ("yes" if cells else "no")
                else:
                    assert int(number) == len(cells), (target, at)
                assert len({item.cells[r - 1][c - 1] for r, c in cells}) <= 1
                checked += 1
    assert checked > 60


def test_traced_copies_point_each_copy_at_its_source():
    """A compose step's value points at the question's value for that colour, a count trace's counted
    colour at the question's colour (an any-question's as its own kind, `asked`), a running sum at the
    sum it adds to and at what it adds (the value or the row's count just before it), the total at the last sum, a row or column number at the
    question's (a colour question's, a compose question's row, a cell reading's k-th cell);
    recomputed here from the grid and the question, so a pointer at a wrong word would fail."""
    from tasks.grid import line_of
    from training.examples import cell_reading, row_tally, traced_copies, value_sum

    rng = random.Random(2)
    seen = {"copy": 0, "sum": 0, "place": 0, "compose traces": 0, "count traces": 0, "colour traces": 0,
            "any traces": 0}
    number = lambda text, at: int(re.match(r"\d+", text[at:]).group())  # noqa: E731
    word = lambda text, at: re.match(r"\w+", text[at:]).group()  # noqa: E731
    axis = lambda text, at: re.search(r"(row|column) $", text[:at]).group(1)  # noqa: E731
    for i in range(36):
        item = grid_item(train_seed(0, i), tier=("count", "compose", "perceive")[i % 3])
        trace = render_example(item, "large", "reason", None, rng)
        reading = cell_reading(item.cells, rng)
        for prompt, target in (trace, value_sum(rng), row_tally(item.cells, rng), reading):
            copies = traced_copies(prompt, target)
            copied = [(at, src) for kind, at, in_prompt, src in copies if kind == "copy" and in_prompt]
            sums = [(at, src) for kind, at, in_prompt, src in copies if kind == "sum" and not in_prompt]
            addends = [(at, src) for kind, at, in_prompt, src in copies if kind == "addend" and not in_prompt]
            places = [(at, src) for kind, at, in_prompt, src in copies if kind == "place" and in_prompt]
            asked = [(at, src) for kind, at, in_prompt, src in copies if kind == "asked" and in_prompt]
            assert len(copied) + len(sums) + len(addends) + len(places) + len(asked) == len(copies)
            if item.kind == "any" and target == trace[1]:  # traced as a count, its colour its own kind
                assert [word(prompt, src) for _, src in asked] == [item.target] * len(item.cells) and not copied
                assert all(word(target, at) == item.target for at, _ in asked)
                seen["any traces"] += 1
            else:
                assert not asked
            for at, src in places:  # a row's number read from the question's row, a column's from its column
                assert number(target, at) == number(prompt, src) and axis(target, at) == axis(prompt, src)
            if target == reading[1]:  # the eight cells, each row and column from the k-th asked
                rows, columns = zip(*[(int(r), int(c)) for r, c in re.findall(r"row (\d+), column (\d+)", prompt)])
                assert [number(target, at) for at, _ in places] == [*rows, *columns] and len(places) == 16
            if item.kind == "colour_at" and target == trace[1]:
                assert sorted(number(target, at) for at, _ in places) == sorted(item.target)
                assert [axis(target, at) for at, _ in places] == ["row", "column"]
                seen["colour traces"] += 1
            if item.kind == "row_sum" and target == trace[1]:
                assert [number(target, at) for at, _ in places] == [item.target[0]]
            seen["place"] += len(places)
            # every running sum (the first too) reads what it adds: the number just before it
            assert [at for at, _ in addends] == [m.start(1) for m in re.finditer(r"\((\d+)\)", target)]
            if item.kind == "row_sum" and target == trace[1]:
                read = line_of(item.cells, item.kind, item.target[0])
                assert [number(prompt, src) for _, src in copied] == [dict(item.target[1])[c] for c in read]
                running = [sum(dict(item.target[1])[c] for c in read[:k + 1]) % 10 for k in range(len(read))]
                assert [number(target, at) for at, _ in sums] == running[1:] + running[-1:]
                assert [number(target, src) for _, src in sums] == running
                assert [number(target, src) for _, src in addends] == [dict(item.target[1])[c] for c in read]
                seen["compose traces"] += 1
            if item.kind == "count" and target == trace[1]:
                assert [word(prompt, src) for _, src in copied] == [item.target] * len(item.cells)
                per_row = [row.count(item.target) for row in item.cells]
                running = [sum(per_row[:k + 1]) for k in range(len(per_row))]
                assert [number(target, at) for at, _ in sums] == running[1:] + running[-1:]
                assert [number(target, src) for _, src in sums] == running
                assert [number(target, src) for _, src in addends] == per_row
                seen["count traces"] += 1
            for at, src in copied:  # the word written is the word read
                assert word(target, at) == word(prompt, src)
            for at, src in sums + addends:
                assert src < at
            seen["copy"] += len(copied)
            seen["sum"] += len(sums)
    assert seen["copy"] > 100 and seen["sum"] > 100 and seen["compose traces"] > 5 and seen["count traces"] > 5
    assert seen["colour traces"] > 3 and seen["any traces"] > 0 and seen["place"] > 36 * 16
