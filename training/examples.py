"""Training examples for the grid task: each objective (direct, reason, transfer, caption, lookup,
tally, census) rendered with `tandem/prompts.py` exactly as the pipeline sends prompts, and the
positions in a target that the auxiliary losses point at (cells read, counts taken, copies a trace
makes). Also the task tokenizer. Owns no tensors and no model."""

from __future__ import annotations

import random
import re
from tasks.datasets import LETTERS
from tasks.grid import COLOURS, EMPTY, PALETTE, PREAMBLE, GridItem, caption, corrupt_trace, grid_item, present_colours, reasoning_trace, train_seed
from tandem import prompts
from tandem.checkpoints import _corpus, build_tokenizer
from tandem.config import SelectorConfig
from tandem.selectors import select_reasoning


FORMATS = {"small": "think_tags", "large": "prompted"}


COUNT_OPTIONS = "four neighbours, the count at a uniform place"  # recorded per run (tasks/grid.py)


CORRUPT_P = 0.25  # share of transfer examples whose hint misreads a cell


# Share of caption examples that read cells in a random order ("row 2, column 3: green." eight times)
# instead of row by row: dense supervision of the random access a colour question needs.
RANDOM_ACCESS_P = 0.0


CENSUS_QUESTIONS = ("How many cells of each colour are there?", f"{PREAMBLE} Count the cells of each colour.")


CAPTION_QUESTIONS = ("Describe the grid row by row.", f"{PREAMBLE} Read every cell, row by row, from the top left.")


EOS = "<|im_end|>"


def answer_text(item: GridItem) -> str:
    return item.options[LETTERS.index(item.answer)]


def excerpt(trace: str, tokenizer, rng: random.Random) -> str:
    """What a selector would transfer of this trace: all of it, head and tail, or scored spans."""
    texts = [tokenizer.decode([t], skip_special_tokens=True) for t in tokenizer(trace)["input_ids"]]
    kind = rng.choices(["full", "budget", "attention"], weights=[0.5, 0.25, 0.25])[0]
    budget = rng.randint(16, 48)
    config = SelectorConfig(kind=kind, budget_tokens=budget, span_tokens=rng.choice([8, 16]))
    scores = [rng.random() for _ in texts] if kind == "attention" else None
    return select_reasoning(texts, config, scores).text


def render_example(item: GridItem, role: str, objective: str, tokenizer, rng: random.Random) -> tuple[str, str]:
    """(prompt, target) exactly as the pipeline would send the prompt and the model should go on."""
    fmt, question, answer = FORMATS[role], item.prompt(), answer_text(item) + EOS
    if objective == "direct":
        return prompts.direct_prompt(question, 1, fmt), answer
    if objective == "caption":
        if rng.random() < RANDOM_ACCESS_P:
            question, target = cell_reading(item.cells, rng)
            return prompts.direct_prompt(question, 1, fmt), target + EOS
        return prompts.direct_prompt(rng.choice(CAPTION_QUESTIONS), 1, fmt), caption(item.cells) + EOS
    if objective == "reason":
        prompt = prompts.reasoning_prompt(question, 1, fmt)
        # After "Answer:" the space belongs to the answer's word, as BPE splits natural text.
        space = " " if fmt == "prompted" else ""
        return prompt, prompts.answer_after_reasoning(prompt, item.trace, fmt)[len(prompt):] + space + answer
    if objective == "lookup":
        question, target = value_sum(rng)
        return prompts.direct_prompt(question, 1, fmt), target + EOS
    if objective == "tally":
        question, target = row_tally(item.cells, rng)
        return prompts.direct_prompt(question, 1, fmt), target + EOS
    if objective == "census":
        return prompts.direct_prompt(rng.choice(CENSUS_QUESTIONS), 1, fmt), census(item.cells) + EOS
    trace = corrupt_trace(item, rng)[0] if rng.random() < CORRUPT_P else item.trace
    return prompts.transfer_prompt(question, 1, excerpt(trace, tokenizer, rng), fmt), answer


def cell_reading(cells, rng: random.Random, n: int = 8) -> tuple[str, str]:
    """(question, target) naming n cells in a random order, each read as a colour question's trace
    reads it."""
    side = len(cells)
    picks = rng.sample([(r, c) for r in range(1, side + 1) for c in range(1, side + 1)], n)
    question = f"{PREAMBLE} Name the colour of these cells: " + "; ".join(f"row {r}, column {c}" for r, c in picks) + "."
    return question, " ".join(f"row {r}, column {c}: {cells[r - 1][c - 1]}." for r, c in picks)


def value_sum(rng: random.Random, n: int = 8) -> tuple[str, str]:
    """(question, target): a compose question over n colours named in the text instead of read from
    the image, answered as a compose trace is ("yellow 3 (3) red 5 (8) ... total 8."): dense
    supervision of the two steps of compose traces the first trained small model missed — it read
    every cell right but copied the wrong value in 50 of 60 held-out traces, and once it copied them
    right, the running sum modulo 10 was its next error."""
    values = [(c, rng.randint(1, 9)) for c in COLOURS] + [(EMPTY, 0)]
    listed = ", ".join(f"{c} {v}" for c, v in values if c != EMPTY)
    picks = [rng.choice(values) for _ in range(n)]
    question = (f"{PREAMBLE} Each colour has a value: {listed}, white 0. Add up the values of these "
                f"colours: {', '.join(c for c, _ in picks)}. What is the total modulo 10?")
    total, words = 0, []
    for colour, value in picks:
        total = (total + value) % 10
        words.append(f"{colour} {value} ({total})")
    return question, " ".join(words) + f". total {total}."


def row_tally(cells, rng: random.Random) -> tuple[str, str]:
    """(question, target): a count question over rows written in the text instead of read from the
    image, answered as a count trace is ("row 1: red green red green; red 2 (2). ... total 5."): dense
    supervision of the step the shipped large model's count traces miss — it writes a row right,
    then miscounts it (39 of 40 held-out traces)."""
    colour = rng.choice(present_colours(cells))
    question = f"{PREAMBLE} The rows read: {caption(cells)} How many {colour} cells are there?"
    return question, reasoning_trace(cells, "count", colour)


def census(cells) -> str:
    """Every colour's count, read off the image at once ("blue 3, red 5, white 8."): a direct count of
    each colour the grid shows, in one example — the one-pass count the direct answers need, several
    times denser than a count question's single number."""
    counts = {c: sum(row.count(c) for row in cells) for c in present_colours(cells) + [EMPTY]}
    return ", ".join(f"{c} {n}" for c, n in counts.items() if n) + "."


ROW_CELLS = re.compile(r"row (\d+): ([^.;]*)")


NAMED_CELL = re.compile(r"row (\d+), column (\d+): (\w+)")


COLOUR_WORD = re.compile(r"\b(" + "|".join(PALETTE) + r")\b")


def pointed_cells(item: GridItem, objective: str, target: str) -> list[tuple[int, tuple[int, int]]]:
    """(character offset, (row, column)) of every colour word in a target that names the colour of
    one cell the image shows: the cells of a row as a caption or a trace reads them, a named cell
    ("row 2, column 3: green"), and a colour question's answer. The supervised attention below points
    the decoder at that cell's visual token as the word is predicted."""
    points = {}
    if objective in ("caption", "reason"):
        for m in ROW_CELLS.finditer(target):
            r = int(m.group(1))
            for c, w in enumerate(COLOUR_WORD.finditer(m.group(2)), 1):
                if c <= len(item.cells):
                    points[m.start(2) + w.start()] = (r, c)
        for m in NAMED_CELL.finditer(target):
            points[m.start(3)] = (int(m.group(1)), int(m.group(2)))
    if item.kind == "colour_at" and objective in ("direct", "reason", "transfer"):
        answer = answer_text(item)
        at = target.rfind(answer)
        if at >= 0:
            points[at] = tuple(item.target)
    return sorted(points.items())


COLOUR_COUNT = re.compile(r"\b(" + "|".join(PALETTE) + r") (\d+)\b")


ROW_COUNT = re.compile(r"row (\d+): [^;.]*; (\w+) (\d+)")


def token_at(offsets, at: int) -> int:
    """The index of the token whose characters (a tokenizer's offset mapping) hold character `at`."""
    return next(i for i, (a, b) in enumerate(offsets) if a <= at < b)


def question_colour_at(prompt: str, item: GridItem) -> int:
    """Character offset, in a rendered prompt, of the colour word its count question names."""
    return prompt.index(item.prompt()) + COLOUR_WORD.search(item.prompt()).start()


def counted_cells(item: GridItem, objective: str, target: str) -> list[tuple[int, list[tuple[int, int]]]]:
    """(character offset, the cells counted) of every number in a target that counts cells of one
    colour: a count or any-question's direct answer (the whole grid), a census entry ("blue 3"), and a
    count trace's row count ("...; red 2 (2)": that row's cells). The counting head is taught to attend
    equally to those cells and to the image's start token, so what it reads is 1 / (n + 1): where the
    number is predicted — right after its colour word in a census or a trace — or, for a question's
    answer, at the question's colour word (`Batcher.batch`), from where the answer copies it."""
    G = len(item.cells)
    where = lambda colour, rows: [(r, c) for r in rows for c in range(1, G + 1) if item.cells[r - 1][c - 1] == colour]  # noqa: E731
    if objective == "census":
        return [(m.start(2), where(m.group(1), range(1, G + 1))) for m in COLOUR_COUNT.finditer(target)]
    if item.kind not in ("count", "any"):
        return []
    if objective in ("direct", "transfer"):
        return [(0, where(item.target, range(1, G + 1)))]
    if objective == "reason":
        return [(m.start(3), where(m.group(2), [int(m.group(1))])) for m in ROW_COUNT.finditer(target)]
    return []


VALUE_COPY = re.compile(r"(?<!; )\b(" + "|".join(PALETTE) + r") (\d+) \(")


COUNTED_COPY = re.compile(r"; (" + "|".join(PALETTE) + r") \d")


ASKED_COLOUR = re.compile(r"(?:How many|that are) (" + "|".join(PALETTE) + r")\b")


# An any-question names its colour after one of these (grid.TEMPLATES); its trace counts that colour.
ANY_COLOUR = re.compile(r"(?:Is there a|have the colour) (" + "|".join(PALETTE) + r")\b")


RUNNING_SUM = re.compile(r"\((\d+)\)")


TOTAL = re.compile(r"\btotal (\d+)")


PLACE = re.compile(r"\b(row|column) (\d+)\b")


def running_sums(target: str) -> tuple[list[re.Match], re.Match | None]:
    """A trace's running sums ("(3)") and the total after the last one ("total 3"; None without
    sums): what the copies below read back and what `computed_numbers` weighs."""
    sums = list(RUNNING_SUM.finditer(target))
    return sums, TOTAL.search(target, sums[-1].end()) if sums else None


def traced_copies(prompt: str, target: str) -> list[tuple[str, int, bool, int]]:
    """(kind, character offset in the target, key in the prompt?, character offset of the key) of
    every word of a trace that copies an earlier word. `copy`, from the question: a compose step's
    value ("red 3 (3)", from "Values: red 3, ...") and a count trace's counted colour ("...; red 2",
    from "How many red cells"); `asked`, the same in an any-question's trace ("...; red 0", from "Is
    there a red cell"), a kind of its own (below); `sum`: a running sum or the total, from the sum it
    adds to ("... (3) green 7 (0)": 0 reads 3 back; "total 0" reads the last; a trace's first sum has
    none); `addend`: every running sum, from what it adds (the number just before it: "7" in "green 7
    (0)"); `place`, from
    the question: a row or column number the question names ("row 2, column 3: green." for "... in row 2,
    column 3?", a compose trace's "row 3:", a cell reading's eight cells, the k-th written for the k-th
    asked). A count trace's row count is counted from the image, not copied: it is not here. Compose,
    count and colour traces, the lookup, tally and cell-reading targets alike. These are where the
    large model's own traces go wrong untaught: most of its count traces first write another colour than
    the question's after the row, most of its compose traces first a wrong value, and its colour traces
    another row or column than the question's (docs/training.md). `asked`, an any-question's colour, is
    not taught as `copy`: that cost the compose traces, so it is its own kind, off unless a phase names it, and its loss is added to the others' mean
    rather than averaged into it: naming it leaves every other kind's weight as it was."""
    copies = []
    for m in VALUE_COPY.finditer(target):
        listed = re.search(rf"\b{m.group(1)} (\d+)\b", prompt)
        if listed:
            copies.append(("copy", m.start(2), True, listed.start(1)))
    asked = ASKED_COLOUR.search(prompt)
    copies += [("copy", m.start(1), True, asked.start(1)) for m in COUNTED_COPY.finditer(target) if asked]
    asked = ANY_COLOUR.search(prompt)
    copies += [("asked", m.start(1), True, asked.start(1)) for m in COUNTED_COPY.finditer(target) if asked]
    sums, total = running_sums(target)
    copies += [("sum", m.start(1), False, before.start(1)) for before, m in zip(sums, sums[1:])]
    for m in sums:
        if addend := re.search(r"(\d+) $", target[:m.start()]):
            copies.append(("addend", m.start(1), False, addend.start(1)))
    if total:
        copies.append(("sum", total.start(1), False, sums[-1].start(1)))
    for axis in ("row", "column"):
        asked = [m for m in PLACE.finditer(prompt) if m.group(1) == axis]
        written = [m for m in PLACE.finditer(target) if m.group(1) == axis]
        if len(asked) == len(written):  # the k-th place written is the k-th asked, or none is a copy
            copies += [("place", w.start(2), True, a.start(2)) for a, w in zip(asked, written)
                       if a.group(2) == w.group(2)]
    return copies


# A trace's conclusion: its total ("total 4.") or a colour trace's colour ("row 1, column 2: white.").
CONCLUSION = re.compile(r"\btotal (\d+)\.|\bcolumn \d+: (\w+)\.")


def concluded(prompt: str, target: str, objective: str, answer: str) -> list[tuple[str, int, bool, int]]:
    """`verdict`, in the shape of `traced_copies`: the answer's first word copying the conclusion of the
    trace it follows — the hint's, in a transfer prompt; the model's own, after a reasoning target's
    trace — when that conclusion is the answer (a corrupted hint's total often is not: the answer is
    then not a copy). An any-question's "yes" or "no" is not written in its trace: none. Without it a
    large model answers compose items wrong on the transfer path right after a hint that ends in the
    right total: nothing teaches the answer to read the hint's last number. Off unless a phase names it, and added beside the other kinds' mean (`ADDED_KINDS`)."""
    if objective == "transfer":
        text, at, in_prompt = prompt, 0, True
    elif objective == "reason":
        at = target.rindex(answer)
        text, in_prompt = target[:at], False
    else:
        return []
    ends = list(CONCLUSION.finditer(text))
    if not ends:
        return []
    group = 1 if ends[-1].group(1) is not None else 2
    return [("verdict", at, in_prompt, ends[-1].start(group))] if ends[-1].group(group) == answer else []


def computed_numbers(target: str) -> list[int]:
    """Character offsets of every number a target computes rather than copies or reads: a running sum
    ("(3)"), the total after the last one, and a count trace's row count ("...; red 2 (2)": the 2). A
    phase's `computed_weight` weighs their tokens that many times a copied word in their sequence's
    mean loss: in a lookup target they are 9 of ~40 tokens, and the one-run large model's running sums
    stay at chance teacher-forced without it while every word they add is fetched right."""
    sums, total = running_sums(target)
    found = [m.start(1) for m in sums] + [m.start(3) for m in ROW_COUNT.finditer(target)]
    return sorted(found + ([total.start(1)] if total else []))


def task_corpus(n: int = 1500, seed: int = 0) -> list[str]:
    """Text of the task as both models will see it, for the tokenizer's merges, plus generic text so
    other questions still tokenize in reasonable pieces."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        item = grid_item(train_seed(10_000 + seed, i))
        for role in FORMATS:
            for objective in ("direct", "reason", "caption"):
                texts.append("".join(render_example(item, role, objective, None, rng)))
    return texts + _corpus(seed, 1000)


def build_task_tokenizer(seed: int = 0):
    return build_tokenizer(seed, corpus=task_corpus(seed=seed))
