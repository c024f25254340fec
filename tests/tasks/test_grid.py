"""The grid task: the trained pair's accuracy figures mean something only if every item's answer is
right, the same seed gives the same items, the tier mix is what the README says, and no held-out
item was ever a training item."""

import io
import random
import re
from collections import Counter

from PIL import Image

from tasks.datasets import LETTERS, load_jsonl, write_jsonl
from tasks.grid import (CELL_PX, EVAL_SEED_BASE, PALETTE, TIER_MIX, corrupt_trace, eval_seed, grid_item,
                             grid_items, train_seed)


def read_cells(png: bytes) -> list[list[str]]:
    """The colours as drawn, read back from the image's pixels (not from the item's own cells)."""
    img = Image.open(io.BytesIO(png)).convert("RGB")
    names = {rgb: name for name, rgb in PALETTE.items()}
    G = img.width // CELL_PX
    assert img.size == (G * CELL_PX, G * CELL_PX)
    return [[names[img.getpixel((c * CELL_PX + CELL_PX // 2, r * CELL_PX + CELL_PX // 2))] for c in range(G)]
            for r in range(G)]


def recompute(question: str, cells: list[list[str]]) -> str:
    """The answer, worked out from the question's words and the pixels alone."""
    if m := re.search(r"row (\d).* column (\d)\?", question):
        return cells[int(m[1]) - 1][int(m[2]) - 1]
    if m := re.search(r"(?:Is there a (\w+) cell|have the colour (\w+))\?", question):
        colour = m[1] or m[2]
        return "yes" if any(colour in row for row in cells) else "no"
    if m := re.search(r"(?:How many (\w+) cells|cells that are (\w+)\.)", question):
        colour = m[1] or m[2]
        return str(sum(row.count(colour) for row in cells))
    values = {k: int(v) for k, v in re.findall(r"([a-z]+) (\d)[,.]", question)}
    m = re.search(r"(row|column) (\d)[,.]", question)
    i = int(m[2]) - 1
    line = cells[i] if m[1] == "row" else [row[i] for row in cells]
    assert "modulo 10" in question
    return str(sum(values[c] for c in line) % 10)


def test_answers_are_correct_by_construction():
    items = grid_items(600, seed=5)
    for it in items:
        assert len(set(it.options)) == len(it.options) and it.answer in LETTERS[: len(it.options)]
        assert it.options[LETTERS.index(it.answer)] == recompute(it.question, read_cells(it.image)), it.question
    assert {it.kind for it in items} == {"colour_at", "any", "count", "row_sum"}


def test_same_seed_same_items_other_seed_other_items():
    assert grid_items(20, seed=1) == grid_items(20, seed=1)
    assert grid_items(20, seed=1) != grid_items(20, seed=2)
    assert grid_item(123) == grid_item(123)


def test_tiers_follow_the_documented_mix():
    counts = Counter(it.tier for it in grid_items(3000, seed=0))
    for tier, share in TIER_MIX.items():
        assert abs(counts[tier] / 3000 - share) < 0.03, (tier, counts)


def test_count_options_do_not_give_the_count_away():
    # Four neighbouring numbers with the count at any place among them: a rule that reads only the
    # options (the one nearest their mean, the lower on a tie) must do no better than a guess. With the
    # count in the middle of its pool it was right on 61 % of count items.
    counts = [it for it in grid_items(4000, seed=3) if it.tier == "count"]
    ranks = Counter(sorted(map(int, it.options)).index(int(it.options[LETTERS.index(it.answer)])) for it in counts)
    assert all(abs(ranks[k] / len(counts) - 0.25) < 0.08 for k in range(4)), ranks
    for it in counts:
        values = sorted(map(int, it.options))
        assert values == list(range(values[0], values[0] + 4)) and values[0] >= 0 and values[-1] <= 16
    from training.probes.trace_errors import options_rule

    mean_rule = sum(options_rule(it) == it.options[LETTERS.index(it.answer)] for it in counts) / len(counts)
    assert mean_rule < 0.35, mean_rule


def test_training_and_held_out_seeds_never_overlap():
    train = {train_seed(s, i) for s in range(3) for i in (0, 1, 10**6, 10**12)}
    held_out = {eval_seed(s, i) for s in range(3) for i in (0, 1, 10**6, 10**12)}
    assert max(train) < EVAL_SEED_BASE <= min(held_out)
    a, b = grid_items(200, 0, "train"), grid_items(200, 0, "eval")
    assert not {(x.image, x.question) for x in a} & {(y.image, y.question) for y in b}


def test_traces_reach_the_answer_and_a_corrupted_trace_misreads_one_cell():
    rng = random.Random(0)
    changed = 0
    for it in grid_items(200, seed=3):
        answer = it.options[LETTERS.index(it.answer)]
        assert it.trace.endswith((f"total {answer}.", f": {answer}.")) or it.kind == "any"
        trace, wrong = corrupt_trace(it, rng)
        assert trace != it.trace
        changed += wrong != answer
        words = lambda t: [w for w in re.findall(r"[a-z]+", t) if w in PALETTE]  # noqa: E731
        diffs = [(a, b) for a, b in zip(words(it.trace), words(trace)) if a != b]
        assert len(diffs) == 1  # one cell misread
    assert changed > 180  # nearly always a misread that changes the answer


def test_jsonl_export_keeps_tiers(tmp_path):
    items = grid_items(5, seed=0)
    write_jsonl(items, tmp_path / "grid.jsonl")
    loaded = load_jsonl(tmp_path / "grid.jsonl")
    assert [(x.question, x.answer, x.tier) for x in loaded] == [(x.question, x.answer, x.tier) for x in items]
