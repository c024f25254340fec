"""The "grid" task : the visual task the trained tiny pair learns, built so the paper's
findings can show on a CPU.

An image is a G x G grid of flat-coloured cells, 32 px each, so one merged Qwen3-VL visual token
(16 px patches, 2 x 2 merge) covers exactly one cell. Questions are multiple choice (A-D, answered
with the option's text) in three tiers:

- perceive (50 %): the colour of one cell, or whether a colour occurs at all;
- count (25 %): how many cells have a colour (four neighbouring numbers, the count at any place
  among them);
- compose (25 %): several steps over cells — each colour has a value given in the question, and the
  answer is the sum of a row's values modulo 10. (Column sums are implemented but left out of the
  mix: a first small model read columns far worse than rows, which measured that, not reasoning.)

The mix follows MMBench's shape, where most questions need no reasoning (the paper: 3,736 of 4,329
never needed a transfer). Every item carries its programmatic reasoning trace (each cell read, a
running count or sum in parentheses, then the total), and `corrupt_trace` gives the same trace with
one cell misread — the hints the large model learns to check against the image.

Seeds: item i of a split is generated from its own seed, training items from seeds below
`EVAL_SEED_BASE` and held-out items from seeds at or above it, so the two never overlap.
This module knows nothing of models or prompts. `python -m tasks.grid out.jsonl --n 400` exports
held-out items in the benchmarks' JSONL format.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass

from tasks.datasets import LETTERS, Item

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (235, 200, 30),
           "purple": (140, 50, 170), "orange": (245, 140, 20)}
EMPTY = "white"
PALETTE = {**COLOURS, EMPTY: (250, 250, 250)}
CELL_PX = 32  # = patch 16 x merge 2: one visual token per cell
GRID_SIZE = 4
TIER_MIX = {"perceive": 0.5, "count": 0.25, "compose": 0.25}
TIERS = tuple(TIER_MIX)
EVAL_SEED_BASE = 1 << 40  # held-out item seeds start here; training seeds stay below


@dataclass(frozen=True)
class GridItem(Item):
    cells: tuple[tuple[str, ...], ...] = ()
    kind: str = ""  # colour_at, any, count, row_sum, column_sum
    target: tuple = ()  # what the question points at: (row, col), a colour, or (axis index, values)
    trace: str = ""


# --- the answer, computed from the cells ----------------------------------------------------------
def line_of(cells, kind: str, index: int) -> list[str]:
    """The cells a row or column question reads (index 1-based), in reading order."""
    return list(cells[index - 1]) if kind == "row_sum" else [row[index - 1] for row in cells]


def solve(cells, kind: str, target) -> str:
    """The correct option text for a question about `cells`, computed directly."""
    if kind == "colour_at":
        r, c = target
        return cells[r - 1][c - 1]
    if kind == "any":
        return "yes" if any(target in row for row in cells) else "no"
    if kind == "count":
        return str(sum(row.count(target) for row in cells))
    index, values = target
    return str(sum(dict(values)[c] for c in line_of(cells, kind, index)) % 10)


def read_row(cells, r: int) -> str:
    """Row r as every trace and caption reads it."""
    return f"row {r}: " + " ".join(cells[r - 1])


def caption(cells) -> str:
    """The whole grid, row by row (the grounding objective's target)."""
    return " ".join(read_row(cells, r) + "." for r in range(1, len(cells) + 1))


def reasoning_trace(cells, kind: str, target) -> str:
    """The program's step-by-step reading: what the small model learns to write and the large model
    learns to use. Each step needs only what is near it, so a 2-layer model can take it: a cell is
    named by its row and column right before it is read; a count reads a row, then counts that row
    and adds it to the running total in parentheses; a value is copied from the question, where it
    follows its colour as it does here; a running sum sits in parentheses. (What 2-layer models
    trained here could not do: pick the c-th cell of a row they had just written, or decide cell by
    cell whether it has the counted colour.)"""
    if kind == "colour_at":
        r, c = target
        return f"row {r}, column {c}: {cells[r - 1][c - 1]}."
    if kind in ("any", "count"):
        n, rows = 0, []
        for r, row in enumerate(cells, 1):
            n += row.count(target)
            rows.append(f"{read_row(cells, r)}; {target} {row.count(target)} ({n}).")
        return " ".join(rows) + f" total {n}."
    index, values = target
    values, total, words = dict(values), 0, []
    for colour in line_of(cells, kind, index):
        total = (total + values[colour]) % 10
        words.append(f"{colour} {values[colour]} ({total})")
    axis = "row" if kind == "row_sum" else "column"
    return f"{axis} {index}: {' '.join(words)}. total {total}."


def corrupt_trace(item: GridItem, rng: random.Random) -> tuple[str, str]:
    """(trace, its answer) with one cell the question reads misread as another colour; the misread is
    chosen so the answer changes when any such misread exists (a hint worth checking)."""
    G = len(item.cells)
    if item.kind == "colour_at":
        read = [(item.target[0] - 1, c) for c in range(G)]
    elif item.kind in ("row_sum", "column_sum"):
        i = item.target[0] - 1
        read = [(i, c) for c in range(G)] if item.kind == "row_sum" else [(r, i) for r in range(G)]
    else:
        read = [(r, c) for r in range(G) for c in range(G)]
    true = solve(item.cells, item.kind, item.target)
    candidates = [(pos, colour) for pos in read for colour in PALETTE if colour != item.cells[pos[0]][pos[1]]]
    rng.shuffle(candidates)
    fallback = None
    for (r, c), colour in candidates:
        cells = [list(row) for row in item.cells]
        cells[r][c] = colour
        cells = tuple(tuple(row) for row in cells)
        answer = solve(cells, item.kind, item.target)
        if answer != true:
            return reasoning_trace(cells, item.kind, item.target), answer
        fallback = fallback or (reasoning_trace(cells, item.kind, item.target), answer)
    return fallback


# --- questions --------------------------------------------------------------------------------------
def _options(rng: random.Random, correct: str, pool: list[str]) -> tuple[tuple[str, ...], str]:
    others = rng.sample([p for p in pool if p != correct], min(3, len(pool) - 1))
    options = others + [correct]
    rng.shuffle(options)
    return tuple(options), LETTERS[options.index(correct)]


def _cells(rng: random.Random, G: int) -> tuple[tuple[str, ...], ...]:
    # A few colours per grid (plus empty cells), so counts spread and some colours are absent.
    used = rng.sample(list(COLOURS), rng.randint(2, 5)) + [EMPTY]
    return tuple(tuple(rng.choice(used) for _ in range(G)) for _ in range(G))


# Several phrasings per question, and a preamble on half of them: the words before the answer vary in
# length, so a model must find a cell by what it is (its row and column), not by how far back it sits.
TEMPLATES = {
    "colour_at": ("What colour is the cell in row {r}, column {c}?", "Which colour fills row {r}, column {c}?",
                  "Look at row {r}. What colour is its cell in column {c}?"),
    "any": ("Is there a {colour} cell?", "Does any cell of the grid have the colour {colour}?"),
    "count": ("How many {colour} cells are there?", "Count the cells that are {colour}. How many are there?"),
    "row_sum": ("Values: {values}, white 0. What is the sum of the values in row {r}, modulo 10?",
                "Each colour has a value: {values}, white 0. Add up the values of the cells in row {r}. "
                "What is the total modulo 10?"),
}
PREAMBLE = "The image shows a 4 by 4 grid of coloured cells."


def present_colours(cells) -> list[str]:
    """The colours (not the empty cells) a grid shows, sorted: what a count question may ask about."""
    return sorted({c for row in cells for c in row} - {EMPTY})


def _question(rng: random.Random, cells, tier: str) -> tuple[str, str, object, list[str] | None]:
    """(kind, question text, target, option pool) of one tier."""
    G = len(cells)
    present = present_colours(cells)
    if tier == "perceive" and rng.random() < 0.7:
        kind, r, c = "colour_at", rng.randint(1, G), rng.randint(1, G)
        target, pool, fields = (r, c), list(PALETTE), dict(r=r, c=c)
    elif tier == "perceive":
        absent = sorted(set(COLOURS) - set(present))
        colour = rng.choice(absent) if absent and rng.random() < 0.5 else rng.choice(present)
        kind, target, pool, fields = "any", colour, ["yes", "no"], dict(colour=colour)
    elif tier == "count":
        colour = rng.choice(present)
        kind, target, pool, fields = "count", colour, None, dict(colour=colour)
    else:
        # Row sums only: column sums are implemented (column_sum) but left out, see the module docstring.
        values = tuple((c, rng.randint(1, 9)) for c in COLOURS) + ((EMPTY, 0),)
        kind, r = "row_sum", rng.randint(1, G)
        listed = ", ".join(f"{c} {v}" for c, v in values if c != EMPTY)
        target, pool, fields = (r, values), [str(d) for d in range(10)], dict(r=r, values=listed)
    question = rng.choice(TEMPLATES[kind]).format(**fields)
    if rng.random() < 0.5:
        question = f"{PREAMBLE} {question}"
    return kind, question, target, pool


def _count_pool(rng: random.Random, n: int, G: int) -> list[str]:
    """Four neighbouring numbers, as a real multiple-choice question would offer, with the count at a
    uniformly drawn place among them: with the count at the middle of a pool, the option nearest the
    options' mean is the count on 61 % of count items — answerable without looking, and a trained
    model learns that instead of counting (docs/training.md)."""
    low = rng.randint(max(0, n - 3), min(n, G * G - 3))
    return [str(k) for k in range(low, low + 4)]


def render(cells) -> bytes:
    from PIL import Image, ImageDraw

    G = len(cells)
    img = Image.new("RGB", (G * CELL_PX, G * CELL_PX))
    draw = ImageDraw.Draw(img)
    for r, row in enumerate(cells):
        for c, colour in enumerate(row):
            draw.rectangle((c * CELL_PX, r * CELL_PX, (c + 1) * CELL_PX - 1, (r + 1) * CELL_PX - 1),
                           fill=PALETTE[colour])
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def grid_item(seed: int, tier: str | None = None, G: int = GRID_SIZE) -> GridItem:
    """One item, a pure function of its seed (and tier, when forced)."""
    rng = random.Random(seed)
    if tier is None:
        tier = rng.choices(TIERS, weights=[TIER_MIX[t] for t in TIERS])[0]
    cells = _cells(rng, G)
    kind, question, target, pool = _question(rng, cells, tier)
    answer = solve(cells, kind, target)
    options, letter = _options(rng, answer, pool if pool is not None else _count_pool(rng, int(answer), G))
    return GridItem(render(cells), question, options, letter, tier, cells=cells, kind=kind, target=target,
                    trace=reasoning_trace(cells, kind, target))


def train_seed(seed: int, i: int) -> int:
    """The seed of training item i: below EVAL_SEED_BASE for every run seed and index."""
    return (seed * 1_000_003 + i) % EVAL_SEED_BASE


def eval_seed(seed: int, i: int) -> int:
    return EVAL_SEED_BASE + (seed * 1_000_003 + i) % EVAL_SEED_BASE


def grid_items(n: int, seed: int = 0, split: str = "eval") -> list[GridItem]:
    """n items of a split ("train" or held-out "eval"), the same for the same seed."""
    make_seed = eval_seed if split == "eval" else train_seed
    return [grid_item(make_seed(seed, i)) for i in range(n)]


def write_sample(item: GridItem, folder, name: str = "grid") -> None:
    """One item as the demo sends it: <name>.png and <name>.json (prompt with options, answer)."""
    import json
    from pathlib import Path

    folder = Path(folder)
    (folder / f"{name}.png").write_bytes(item.image)
    (folder / f"{name}.json").write_text(json.dumps({
        "image": f"{name}.png", "prompt": item.prompt(), "tier": item.tier, "answer": item.answer,
        "answer_text": item.options[LETTERS.index(item.answer)]}, indent=1) + "\n")


def main(argv=None) -> int:
    """Export items as the benchmarks' JSONL (image as base64, question, options, answer, tier), or
    one held-out item as a demo sample."""
    import argparse

    from tasks.datasets import write_jsonl

    ap = argparse.ArgumentParser(description="Write grid-task items as JSONL, or one as a demo sample.")
    ap.add_argument("out", help="the .jsonl file to write (with --sample: the folder)")
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split", choices=["eval", "train"], default="eval", help="held-out (default) or training items")
    ap.add_argument("--sample", type=int, metavar="INDEX", help="write item INDEX as OUT/grid.png + OUT/grid.json")
    args = ap.parse_args(argv)
    if args.sample is not None:
        write_sample(grid_items(args.sample + 1, args.seed, args.split)[-1], args.out)
        print(f"wrote {args.split} item {args.sample} (seed {args.seed}) to {args.out}/grid.png and grid.json")
        return 0
    write_jsonl(grid_items(args.n, args.seed, args.split), args.out)
    print(f"wrote {args.n} {args.split} items (seed {args.seed}) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
