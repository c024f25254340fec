"""Trains the tiny Qwen3-VL pair on the grid task (DESIGN §9) and writes the checkpoints Tandem ships.

    python -m benchmarks.train_tiny --role large --procs 2 --batch-size 32 \
        --schedule benchmarks/schedules/large-verdict.json   # the shipped large model (~14 min, both cores)
    python -m benchmarks.train_tiny --role large         # the first stage of L6a, shipped before (15-21 min)
    python -m benchmarks.train_tiny --role small         # a small model from scratch (~12 min, 1 thread)
    python -m benchmarks.train_tiny --role small --init-from BASE --steps 500 --lr 1e-3 \
        --mix direct=0.2,reason=0.4,caption=0.1,lookup=0.3   # its second stage (~2 min; the shipped one's)
    python -m benchmarks.train_tiny --role small --procs 2 --schedule benchmarks/schedules/small.json
        # the shipped small model: stages in one run, on both cores (~11 min)
    python -m benchmarks.train_tiny --role small --steps 20 --out /tmp/t   # a smoke run
    python -m benchmarks.train_tiny --card results/strategies-*/strategies.json   # model cards with accuracy

From scratch (or on from a checkpoint, `--init-from`), on the CPU, with a plain torch loop (AdamW,
warm-up then cosine), seeded: the same command gives the same weights. The first steps read grids
only (a curriculum), then each batch takes one objective from the role's mix. `--schedule` chains
stages in one run from scratch: each phase a later stage's settings (steps, peak LR, mix, tiers, a
fresh AdamW), with no checkpoint between. `--procs 2` trains data-parallel on both cores (each
process on its half of every batch, the gradients averaged before each step): 1.35-1.5x faster
here, and other weights than one process gives. Every example is
rendered with `tandem/prompts.py`, and prompt and target are tokenized apart, exactly as the
pipeline sends the prompt and the model continues it:

- direct: the short-answer prompt -> the option's text;
- reason: the reasoning prompt -> the program's trace, the close of the reasoning, the answer
  (the small model in `<think>` tags, the large one in the prompted format);
- transfer (large only): the transfer prompt holding an excerpt of a trace cut by the real selectors
  (`full`, `budget`, `attention` with random scores) -> the true answer, the trace misreading one
  cell in a quarter of them, so the model checks a hint against the image instead of copying it;
- caption: "Describe the grid row by row." -> every cell, row by row (a grounding objective: without
  it the first prototype collapsed to one constant answer). The vision tower's position table
  starts as a 2D sin-cos grid, so the decoder can tell cells apart from the first step;
- lookup (`--mix ...,lookup=0.3`): a compose trace over colours named in the text instead of the
  image — eight value copies and running sums per example. From scratch at 20 % one run's compose
  answers after reasoning went 25 -> 71 %, but it lost its count traces; in a second stage on the
  trained small model (`--init-from`, 500 steps at 30 %) it lifted the compose traces and kept the
  rest: the shipped small model's second stage (benchmarks/LEVERS.md, levers on the small model's
  compose traces);
- tally (the large model's; `--mix ...,tally=0.2`): a count trace over rows written in the text instead
  of read from the image — the counting step the large model's count traces missed. At 20 % one large
  run of three learned to count (its reasoning then beat its direct answers, 71.5 vs 48.5 %) but not
  to look a cell up directly; with a finishing mix (direct-heavy for the last 10 % of the steps,
  `FINISH_MIX`, `--finish-mix`) the run did both: the shipped large model's first stage
  (benchmarks/LEVERS.md, levers on counting: LF01);
- census (`--mix ...,census=S`): "How many cells of each colour are there?" -> "blue 3, red 5, white 8."
  straight from the image: every colour's direct count in one example; it taught the shipped large
  model to count in one pass (benchmarks/LEVERS.md, the count options' leak).

A schedule's phase may also set `attend` (the weight of an auxiliary loss, `PointerProbe`): one head
is taught to attend to the cell a colour word reads, another to the cells a number counts (and a
third, at a question's answer, to the question's colour word, where the count is taken;
`count_attend` weighs those two apart). It brought the large model's look-up of a named cell from
~1,800 steps of 32 to under 1,500, and the best large models trained in one run in about 15 min
(`benchmarks/schedules/large-count.json`). `count_readout` (`CountLens`) weighs a readout target:
where a count is taken, the stream after the counting layer is taught to say the number; it raised
the one-run direct count from 66 to 80-84 %, and one run of 12.8 min met F2
(`benchmarks/schedules/large-readout.json`; not shipped: its own traces score below its direct
answers, so not F3 — benchmarks/LEVERS.md, supervised attention, where the count is taken, and the
count said where it is taken). `trace_attend` teaches three more heads the copies a trace makes
(`traced_copies`: a word copied from the question, a running sum's previous sum and its addend) and
`trace_readout` the copied word said at the copy head's layer: the large model's own traces then copy
right (teacher-forced, 31-38 % -> 100 %) and its count traces went from 0 to 21 of 60 exact in one run
of 13.5 min (`benchmarks/schedules/large-trace.json`); a phase's `trace_kinds` adds `place` (a row or
column a trace copies from the question: the colour traces' first error, fixed in one run of 13.7 min,
`benchmarks/schedules/large-place.json`), its `trace_heads` moves a kind to another head, and a first
phase's `number_init` starts the number tokens on circles (`init_number_embeddings`). A running sum
modulo 10 was what was left: neither of the last two taught it, twice the lookup did and cost the
one-pass count (benchmarks/LEVERS.md, the trace's copies; the trace's places and sums). A phase's
`computed_weight` weighs the numbers a trace computes (`computed_numbers`: running sums, totals, a
count trace's row counts) that many times a copied word in their sequence's mean loss: at 4 the sums
came within the same steps, in two seeds of two (compose traces 2 -> 46 and 56 of 60 exact, 13-14
min, `benchmarks/schedules/large-computed.json`); at 8 the copies broke (benchmarks/LEVERS.md, the
numbers a trace computes); `answer_weight` weighs the same way the answer after a reasoning target's
trace. `trace_kinds` may also name `asked`, an any-question's counted colour (added to the other
kinds' mean, not averaged into it: `trace_attention_loss`; `benchmarks/schedules/large-asked.json`).
`asked` did not better W5 (`large-tally.json`); `answer_weight` 3 in its last two phases
(`large-answer-late.json`) gave a one-run large model whose reasoning scores 7 points over its direct
answers, F2 short (benchmarks/LEVERS.md, an any-question's colour). `verdict` (`concluded`): the
answer's first token taught to look at the conclusion it copies, a hint's total or its own trace's;
with it in the last two phases and the tally dropped, one run of 14.3 min met F1-F3 and is the shipped
large model (`large-verdict.json`; benchmarks/LEVERS.md, the answer's copy of the conclusion).

Both models share one byte-level BPE tokenizer trained on the task's text, so task words are single
tokens. The script owns training only; accuracy comes from `benchmarks.strategies --dataset grid`.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import re
import time
from pathlib import Path

from PIL import Image

from benchmarks.datasets import LETTERS
from benchmarks.grid import (COLOURS, EMPTY, PALETTE, PREAMBLE, TIERS, GridItem, caption, corrupt_trace, grid_item,
                            present_colours, reasoning_trace, train_seed)
from tandem import prompts
from tandem.checkpoints import TRAINED_DIR, _corpus, build_tokenizer, new_tiny, save_checkpoint
from tandem.config import SelectorConfig
from tandem.selectors import select_reasoning

# The small one is tiny:small's width with a third layer (with two, it read the grid well but could not
# count a row or look a value up: reasoning scored below its own direct answers); the large one is
# sized for this CPU (it only has to be clearly bigger: 2x the width, 4 layers, ~4x the parameters),
# so it gets enough steps in the time budget.
TRAINED_SIZES = {
    "small": dict(text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, mrope_section=[2, 3, 3]),
                  vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                              deepstack_visual_indexes=[1]),
                  thinking=True),
    "large": dict(text=dict(hidden_size=96, intermediate_size=288, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=24, mrope_section=[4, 4, 4]),
                  vision=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2,
                              deepstack_visual_indexes=[1]),
                  thinking=False),
}
FORMATS = {"small": "think_tags", "large": "prompted"}
MIX = {"small": {"direct": 0.3, "reason": 0.6, "caption": 0.1},
       "large": {"direct": 0.2, "reason": 0.4, "transfer": 0.15, "caption": 0.05, "tally": 0.2}}
# The large model's last 10 % of steps: direct-heavy. Its mix learns to count (the tally objective at
# 20 %: its reasoning then beats its direct answers) but not to look a cell up directly; the finish
# adds that without unlearning the counting (benchmarks/LEVERS.md, levers on counting: LF01; with the last 15 or
# 25 % the count traces fell apart).
FINISH_MIX = {"small": None,
              "large": {"direct": 0.5, "reason": 0.25, "transfer": 0.1, "caption": 0.05, "tally": 0.1}}
# Curriculum (`read_first`): that share of the steps reads grids only (captions), then the role's
# mix. Mixed from the start, the reasoning objectives drowned the reading signal: a small model no
# better than chance at reading cells after 1,500 mixed steps read 71 % of them after 500
# caption-only steps. Steps are sized to 12-15 min per role on one core of this 2-core machine.
# The large model takes twice the optimizer steps at half the batch (the same examples): at 2,000
# steps x 32 it never learned to look a named cell up (direct answers 35 % on held-out items); at
# 4,000 x 16 it did (65 %, perceive 86 %), but not reliably: two of five such runs made it (benchmarks/LEVERS.md).
DEFAULTS = {"small": dict(steps=3000, lr=3e-3, read_first=0.2, batch_size=32),
            "large": dict(steps=4000, lr=3e-3, read_first=0.25, batch_size=16, finish_share=0.1)}
COUNT_OPTIONS = "four neighbours, the count at a uniform place"  # recorded per run (benchmarks/grid.py)
CORRUPT_P = 0.25  # share of transfer examples whose hint misreads a cell
FINISH_SHARE = 0.2  # default share of the steps a `--finish-mix` takes (at the end of a run)
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
    one-run large model's own traces went wrong: on 60 held-out items each, 53 of its count traces first
    wrote another colour than the question's after the row, 46 of its compose traces first a wrong value
    (benchmarks/LEVERS.md, the trace's copies); with those taught, 14 of the 19 wrong of 60 colour traces
    first wrote another row or column than the question's (session 24). `asked` came after W5's perceive
    traces first wrote another colour than the question's in 10 of their 13 errors, all any-questions;
    taught as `copy` (as the count traces' colour) it cost two runs of two their compose traces (session
    26), so it is its own kind, off unless a phase names it, and its loss is added to the others' mean
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
    then not a copy). An any-question's "yes" or "no" is not written in its trace: none. It came after
    W13 answered 6 of 12 held-out compose items wrong on the transfer path (`always`) right after a
    hint that ended in the right total (session 27): nothing taught the answer to read the hint's
    last number. Off unless a phase names it, and added beside the other kinds' mean (`ADDED_KINDS`)."""
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
    stayed at chance teacher-forced while every word they add was fetched right (session 24)."""
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


class Batcher:
    """Training batches: one item per row, one objective per batch drawn from the role's mix, so a
    batch of short direct prompts is not padded to the length of transfer prompts (1.5-2x fewer
    tokens a step for the large model)."""

    def __init__(self, role: str, tokenizer, image_processor, image_token_id: int, seed: int,
                 reason_tiers: dict[str, float] | None = None, direct_tiers: dict[str, float] | None = None,
                 shard: tuple[int, int] = (0, 1), item_seed=train_seed):
        self.role, self.tok, self.proc, self.image_token_id = role, tokenizer, image_processor, image_token_id
        self.item_seed = item_seed  # (seed, index) -> the item's seed: training items unless a probe says
        self.tiers = {"reason": reason_tiers, "direct": direct_tiers}
        self.rng = random.Random(seed)
        self.seed, self.next_item = seed, 0
        self.mix = MIX[role]  # batch_stream sets it per step
        self.attend = False  # batch_stream sets it per step: the rows' pointers for `PointerProbe`
        # Sharded (one training process of several, `shard` = (rank, world)): every rank draws each
        # batch's objective from the same stream, and its own rows (its share of the batch's item
        # indices) from a stream of its own, so no rank makes another's rows. Unsharded, both come from
        # one stream, in the order they always did.
        self.rank, self.world = shard
        self.pick = self.rng
        if self.world > 1:
            self.pick, self.rng = random.Random(seed), random.Random(f"{seed}/{self.rank}")

    def example(self, objective: str):
        tier = None
        if tiers := self.tiers.get(objective):
            tier = self.rng.choices(list(tiers), weights=list(tiers.values()))[0]
        item = grid_item(self.item_seed(self.seed, self.next_item), tier=tier)
        self.next_item += 1
        prompt, target = render_example(item, self.role, objective, self.tok, self.rng)
        image = Image.open(io.BytesIO(item.image)).convert("RGB")
        return prompt, target, image, (item, objective)

    def batch(self, size: int) -> dict:
        import torch

        objective = self.pick.choices(list(self.mix), weights=list(self.mix.values()))[0]
        if self.world == 1:
            rows = [self.example(objective) for _ in range(size)]
        else:
            if size % self.world:
                raise ValueError(f"a batch of {size} does not split into {self.world} equal shards")
            first, local = self.next_item, size // self.world
            self.next_item += self.rank * local
            rows = [self.example(objective) for _ in range(local)]
            self.next_item = first + size
        pix = self.proc(images=[r[2] for r in rows], return_tensors="pt")
        grid = pix["image_grid_thw"]
        ids, labels, pointers, counters, copies, readouts, computed, answered = [], [], [], [], [], [], [], []
        traced, copied = {kind: [] for kind in TRACE_HEADS}, {kind: [] for kind in SAID_KINDS}
        for row, ((prompt, target, _, (item, objective)), thw) in enumerate(zip(rows, grid)):
            n = int(thw.prod()) // self.proc.merge_size ** 2
            prompt = prompt.replace(prompts.IMAGE_PAD, prompts.IMAGE_PAD * n)
            asked = self.tok(prompt, return_offsets_mapping=self.attend)
            p = asked["input_ids"]
            encoded = self.tok(target, return_offsets_mapping=self.attend)
            t = encoded["input_ids"]
            cells, side = [i for i, x in enumerate(p) if x == self.image_token_id], len(item.cells)
            if self.attend and len(cells) == side * side:
                # The query is the position that predicts the word's first token; a key, a cell's
                # visual token (row-major, as the processor merges them) or the image's start.
                query = lambda at: len(p) - 1 + token_at(encoded["offset_mapping"], at)  # noqa: E731
                key = lambda r, c: cells[(r - 1) * side + c - 1]  # noqa: E731
                pointers += [(row, query(at), key(r, c)) for at, (r, c) in pointed_cells(item, objective, target)]
                for at, counted in counted_cells(item, objective, target):
                    group, q = len(counters), query(at)
                    number = t[q + 1 - len(p)]  # the token the query predicts: the number's first
                    if objective in ("direct", "transfer"):
                        # A question's count is taken at its colour word, where the colour is the
                        # token itself, and the answer copies it from there (`COPY_LAYER`).
                        colour = token_at(asked["offset_mapping"], question_colour_at(prompt, item))
                        copies.append((row, q, colour))
                        q = colour
                    counters += [(row, q, k, group) for k in [cells[0] - 1] + [key(r, c) for r, c in counted]]
                    readouts.append((row, q, number))
            if self.attend:
                for kind, at, in_prompt, source in (traced_copies(prompt, target)
                                                    + concluded(prompt, target, objective, answer_text(item))):
                    key = (token_at(asked["offset_mapping"], source) if in_prompt
                           else len(p) + token_at(encoded["offset_mapping"], source))
                    q = len(p) - 1 + token_at(encoded["offset_mapping"], at)
                    traced[kind].append((row, q, key))
                    if kind in copied:  # what the copy head fetches is the token the query predicts
                        copied[kind].append((row, q, t[q + 1 - len(p)]))
                computed += [(row, len(p) - 1 + token_at(encoded["offset_mapping"], at)) for at in computed_numbers(target)]
                if objective == "reason":  # the answer after the trace: its first token
                    answered.append((row, len(p) - 1 + token_at(encoded["offset_mapping"],
                                                                target.rindex(answer_text(item)))))
            ids.append(p + t)
            labels.append([-100] * len(p) + t)
        width = max(map(len, ids))
        pad = self.tok.pad_token_id
        input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
        return {"input_ids": input_ids,
                "attention_mask": torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids]),
                "labels": torch.tensor([y + [-100] * (width - len(y)) for y in labels]),
                "mm_token_type_ids": (input_ids == self.image_token_id).long(),
                "pixel_values": pix["pixel_values"], "image_grid_thw": grid,
                **({"pointers": torch.tensor(pointers, dtype=torch.long).reshape(-1, 3),
                    "counters": torch.tensor(counters, dtype=torch.long).reshape(-1, 4),
                    "copies": torch.tensor(copies, dtype=torch.long).reshape(-1, 3),
                    "readouts": torch.tensor(readouts, dtype=torch.long).reshape(-1, 3),
                    "computed": torch.tensor(computed, dtype=torch.long).reshape(-1, 2),
                    "answered": torch.tensor(answered, dtype=torch.long).reshape(-1, 2),
                    **{f"{kind}_copies": torch.tensor(found, dtype=torch.long).reshape(-1, 3)
                       for kind, found in traced.items()},
                    **{f"{kind}_readouts": torch.tensor(said, dtype=torch.long).reshape(-1, 3)
                       for kind, said in copied.items()}} if self.attend else {})}


def batch_stream(batcher: Batcher, steps: int, batch_size: int, schedule, workers: int):
    """The run's batches in step order (`schedule(step)` -> (mix, tiers[, attend])), each with the count of items
    drawn so far, made `workers` (0 or 1)
    processes away: with one, the next batches are drawn, rendered and tokenized on the second core while
    the first trains. One producer in step order draws the same random stream as the loop did inline, so
    the weights are the same bit for bit (checked on a whole large-model run), and the training process's
    own torch random state is not touched (the loader seeds its worker from a generator of its own).
    Measured: a batch costs ~50 ms to make against ~210-280 ms to train on, yet 200 large-model steps took
    56.3 s with the worker against 57.9 s inline — the step itself is the large model's time."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            for step in range(steps):
                # the tiers (and the pointers' use) change by phase, as the mix does
                batcher.mix, batcher.tiers, *attend = schedule(step)
                batcher.attend = bool(attend and attend[0])
                yield batcher.batch(batch_size), batcher.next_item

    if workers not in (0, 1):
        raise ValueError("one producer keeps the batches in step order: workers is 0 or 1")
    return DataLoader(Stream(), batch_size=None, num_workers=workers, generator=torch.Generator(),
                      **({"prefetch_factor": 4, "multiprocessing_context": "fork"} if workers else {}))


def init_vision_positions(model) -> None:
    """Give the vision tower's learned position table a 2D sin-cos start (as MAE does), half the
    dimensions for the row and half for the column, at the patch embedding's scale. The default
    init (std 0.02) leaves position ~40x fainter than colour in every visual token, and the decoder
    then takes thousands of steps to learn which cell is where (measured: no better than chance
    after 1,500 steps). Qwen3-VL interpolates this table to the image's patch grid, so a smooth
    table stays smooth there."""
    import torch

    table = model.model.visual.pos_embed.weight
    side, dim = int(table.shape[0] ** 0.5), table.shape[1]
    quarter = dim // 4
    freqs = 1.0 / (10.0 ** (torch.arange(quarter) / quarter))
    axis = torch.arange(side, dtype=torch.float32)[:, None] * freqs[None] * (torch.pi / 2)
    rows = torch.cat([axis.sin(), axis.cos()], 1)  # side x dim/2
    grid = torch.cat([rows[:, None].expand(side, side, -1), rows[None].expand(side, side, -1)], -1)
    with torch.no_grad():
        table.copy_(grid.reshape(side * side, dim) * (2 ** 0.5))


NUMBER_PERIODS = (10, 5, 10 / 3, 2.5, 2, 40)


def init_number_embeddings(model, tokenizer, top: int = 20) -> None:
    """Start every number token from 0 to `top` ("7" and " 7" alike) on circles, in and out: the first
    dimensions of its input embedding and of its output row hold cos and sin of 2πn/T for the periods T
    of `NUMBER_PERIODS` (10 and its harmonics, so that a sum modulo 10 is a rotation, and 40, so that 12
    is not 2), the rest stays random and tells the two spellings apart. The one-run large model's
    traces fetch both terms of a running sum (its heads put 0.98-0.99 of their weight on them) and
    still add them modulo 10 at chance (a third of compose sums right teacher-forced, most of them the
    copied total): a table it has not learned from a random start in fifteen minutes. Tried once (run
    P3, benchmarks/LEVERS.md, the trace's places and sums): the sums stayed at chance with it too. Adds
    no weight: the saved model is a plain Qwen3-VL."""
    import torch

    numbers = {}
    for token, index in tokenizer.get_vocab().items():
        text = tokenizer.convert_tokens_to_string([token]).strip()
        if text.isdigit() and int(text) <= top and text == str(int(text)):
            numbers[index] = int(text)
    n = torch.tensor(list(numbers.values()), dtype=torch.float32)[:, None]
    angles = 2 * torch.pi * n / torch.tensor(NUMBER_PERIODS)[None]
    circle = torch.cat([angles.cos(), angles.sin()], 1)  # len(numbers) x 2 * len(periods)
    rows = torch.tensor(list(numbers))
    for table in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
        with torch.no_grad():
            # at the scale of a random row, so neither half drowns the other
            scale = table.std() * (table.shape[1] / circle.shape[1]) ** 0.5
            table[rows, : circle.shape[1]] = circle * scale


def batch_vision_attention(model) -> None:
    """Attention over a batch's images in one call, for training only (the saved weights and the
    serving path are untouched): Qwen3-VL's SDPA path calls attention once per image per block (64 of
    a small model's 67 attention calls a step); training images share one size, so they stack as a
    batch. The same weights bit for bit (a test holds the outputs equal), 3 % off a small model's step
    (0.276 -> 0.269 s, the same batches, steps interleaved in one process). Images of several sizes
    take the loop. Not done: the patch convolution as one matrix product, 7 % more — the same function
    to float rounding only, and the small model's schedule run with it learned no count traces
    (benchmarks/LEVERS.md, training time, sF): these runs hang on rounding."""
    import types

    import torch.nn.functional as F
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

    for block in model.model.visual.blocks:
        loop = block.attn.forward

        def attention_forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None,
                              loop=loop, **kwargs):
            lengths = cu_seqlens.diff()
            size = int(lengths[0])
            if bool((lengths != size).any()):
                return loop(hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
            seq = hidden_states.shape[0]
            q, k, v = self.qkv(hidden_states).reshape(seq, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
            q, k = apply_rotary_pos_emb_vision(q, k, *position_embeddings)
            q, k, v = (t.reshape(len(lengths), size, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
            out = F.scaled_dot_product_attention(q, k, v, scale=self.scaling)
            return self.proj(out.transpose(1, 2).reshape(seq, -1))

        block.attn.forward = types.MethodType(attention_forward, block.attn)


# The counting head: the pointer's layer, the other key/value group; a question's count is taken at
# its colour word and copied to the answer by a head of the last layer. Measured on 1,500 held-out
# count questions after 1,000 count-heavy steps (benchmarks/LEVERS.md, session 21): 60 % right so,
# 49 % counting at the answer in this layer, 33-44 % a layer earlier (at the answer or the colour word).
COUNT_LAYER, COUNT_HEAD = 2, 2
COPY_LAYER, COPY_HEAD = 3, 1
# The trace's copies (`traced_copies`, a phase's `trace_attend`): in the pointer's layer, each the other
# head of one key/value group — a word copied from the question beside the pointer (both fetch the word
# said next), a running sum's previous sum beside the counting head; a sum's addend, the token just
# before it, a layer earlier, so that both terms are at the sum's position when layer 2 adds them.
# `trace_readout` reads the copy at this layer's output with `CountLens` (the counting layer, the same).
# A row or column number copied from the question (`place`) is a copy from the question too: same head.
TRACE_HEADS = {"copy": (2, 1), "sum": (2, 3), "addend": (1, 0), "place": (2, 1), "asked": (2, 1),
               "verdict": (2, 3)}
# The kinds a phase's `trace_attend` and `trace_readout` teach unless it names them (`trace_kinds`):
# `place`, `asked` and `verdict` came later, and a schedule written before them trains as it did.
TRACE_KINDS = ("copy", "sum", "addend")
# The kinds that copy a word of the question, whose copied token `trace_readout` teaches the stream to say.
SAID_KINDS = ("copy", "place")
# Kinds whose attention loss is added to the mean of the others instead of averaged into it (`asked`,
# `verdict`).
ADDED_KINDS = ("asked", "verdict")
assert TRACE_HEADS["copy"][0] == COUNT_LAYER


class PointerProbe:
    """Supervised attention (an auxiliary loss, for training only): one head of one decoder layer is
    taught to attend, as a colour word of a caption, a trace or an answer is predicted, to the visual
    token of the cell that word reads (`pointed_cells`). The look-up of a named cell is the large
    model's slowest transition (benchmarks/LEVERS.md: ~1,600-2,000 steps of 32 before a colour
    question is answered above chance); the answers alone teach the pointer by one sparse signal
    through every layer, this one names it at the head. The saved model is a plain Qwen3-VL: the
    probe reads the layer's own projections and adds no weight."""

    def __init__(self, model, layer: int = 2, head: int = 0):
        self.attn = model.model.language_model.layers[layer].self_attn
        self.head, self.seen = head, None
        self.attn.register_forward_pre_hook(self.keep, with_kwargs=True)

    def keep(self, module, args, kwargs):
        self.seen = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0], kwargs["position_embeddings"])

    def loss(self, pointers):
        """Mean negative log attention of the head on each pointer's cell: pointers (N, 3) = (row,
        query position, key position), the query the position that predicts the colour word; or
        (N, 4) with a group id last, the keys of one group to be attended equally (a cross-entropy
        against the uniform share over them), averaged per group."""
        import torch
        from transformers.models.qwen3_vl.modeling_qwen3_vl import rotate_half

        hidden, (cos, sin) = self.seen
        a, hd = self.attn, self.attn.head_dim
        rows, q_at, k_at = pointers[:, :3].unbind(1)
        batch, length = hidden.shape[:2]
        kv = self.head // a.num_key_value_groups
        k = a.k_norm(a.k_proj(hidden).view(batch, length, -1, hd)[:, :, kv])
        k = k * cos + rotate_half(k) * sin
        q = a.q_norm(a.q_proj(hidden[rows, q_at]).view(len(rows), -1, hd)[:, self.head])
        q = q * cos[rows, q_at] + rotate_half(q) * sin[rows, q_at]
        scores = torch.einsum("nd,ntd->nt", q, k[rows]).float() * a.scaling
        future = torch.arange(length)[None] > q_at[:, None]
        logp = scores.masked_fill(future, float("-inf")).log_softmax(-1)
        picked = -logp[torch.arange(len(rows)), k_at]
        if pointers.shape[1] == 3:
            return picked.mean()
        groups = pointers[:, 3]
        size = torch.bincount(groups).float()
        return (picked / size[groups]).sum() / (size > 0).sum()


class CountLens:
    """A readout target (an auxiliary loss, for training only): where a count is taken — the counting
    head's query — the residual stream after the counting layer, read through the model's own final
    norm and vocabulary projection, is taught to say the count's number, so that what the copy head
    (the next layer) moves from a question's colour word to its answer is already the number. Adds no
    weight: the saved model is a plain Qwen3-VL."""

    def __init__(self, model, layer: int = COUNT_LAYER):
        self.model, self.seen = model, None
        model.model.language_model.layers[layer].register_forward_hook(self.keep)

    def keep(self, module, args, output):
        self.seen = output[0] if isinstance(output, tuple) else output

    def loss(self, readouts):
        """Cross-entropy of the number's first token at each readout: (N, 3) = (row, position, token)."""
        import torch.nn.functional as F

        rows, at, token = readouts.unbind(1)
        hidden = self.model.model.language_model.norm(self.seen[rows, at])
        return F.cross_entropy(self.model.lm_head(hidden).float(), token)


def sequence_mean_loss(logits, labels):
    """Cross-entropy averaged per sequence, then over the batch: a two-token direct answer weighs as
    much as a fifty-token trace."""
    import torch.nn.functional as F

    logits, labels = logits[:, :-1].float(), labels[:, 1:]
    mask = labels != -100
    loss = F.cross_entropy(logits.transpose(1, 2), labels.clamp(min=0), reduction="none") * mask
    return (loss.sum(1) / mask.sum(1).clamp(min=1)).mean()


def answer_loss(model, batch: dict, labels, weights=None):
    """`sequence_mean_loss` with the vocabulary projection taken only where there is a target: most
    of a sequence is the prompt (the image, the question, the options), so the full logits were mostly
    thrown away. The same loss up to float rounding; measured 9 % (large) and 21 % (small) off a step.
    `weights` (the shape of `labels` less one column, by the position that predicts a token) weighs
    tokens within their sequence's mean, which still divides by the count of target tokens."""
    import torch
    import torch.nn.functional as F

    hidden = model.model(**batch)[0][:, :-1]
    targets = labels[:, 1:]
    mask = targets != -100
    per_token = F.cross_entropy(model.lm_head(hidden[mask]).float(), targets[mask], reduction="none")
    if weights is not None:
        per_token = per_token * weights[mask]
    per_row = torch.zeros(len(labels), dtype=per_token.dtype).index_add_(0, mask.nonzero()[:, 0], per_token)
    return (per_row / mask.sum(1).clamp(min=1)).mean()


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def mix_at(step: int, steps: int, read_first: float, mix: dict[str, float],
           finish_mix: dict[str, float] | None = None, finish_share: float = FINISH_SHARE) -> dict[str, float]:
    """The objectives' mix of one step: captions only for the first `read_first` of the steps, the
    role's mix, and `finish_mix` for the last `finish_share` of them when given."""
    if step < read_first * steps:
        return {"caption": 1.0}
    if finish_mix and step >= (1 - finish_share) * steps:
        return finish_mix
    return mix


def role_schedule(role: str, mix: dict[str, float] | None = None, finish_mix: dict[str, float] | None = None,
                  finish_share: float | None = None) -> tuple[dict, dict | None, float]:
    """(mix, finish_mix, finish_share) of a run: without `mix`, the role's own (MIX, FINISH_MIX and its
    DEFAULTS' share); a `mix` given alone runs to the end, so the levers' recorded commands still
    reproduce."""
    if mix is None:
        mix, finish_mix = MIX[role], finish_mix or FINISH_MIX[role]
    if finish_share is None:
        finish_share = DEFAULTS[role].get("finish_share", FINISH_SHARE)
    return mix, finish_mix, finish_share


def cpu_facts() -> dict:
    """The CPU a run trained on, as far as float rounding goes: PyTorch's CPU kernels take other code
    paths by instruction set (AVX-512, AMX), and one fp32 run on another CPU ends elsewhere (README,
    reproducing the pair). Linux only; empty elsewhere."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}  # the first processor's
    for line in info.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    import torch

    return {"model": fields.get("model name", ""),
            "isa": sorted(f for f in flags if f.startswith(("avx512f", "amx", "avx2", "fma"))),
            "torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability()}


def from_checkpoint(ref: str):
    """(model, processor, tokenizer, facts) of a saved checkpoint, loaded as the engines load it, to
    train on; facts: its training.json, None when it has none."""
    from transformers import AutoModelForImageTextToText

    from tandem.checkpoints import resolve_model_ref
    from tandem.processors import load_processor

    path = Path(resolve_model_ref(ref))
    processor = load_processor(str(path))
    facts = json.loads((path / "training.json").read_text()) if (path / "training.json").exists() else None
    return AutoModelForImageTextToText.from_pretrained(path), processor, processor.tokenizer, facts


def probed_model(ref: str):
    """(model, processor, tokenizer, facts) of a checkpoint to probe: one thread, as a replica runs, in
    eval mode (`benchmarks.count_probe`, `benchmarks.copy_probe`); facts: its training.json or None."""
    import torch

    torch.set_num_threads(1)
    model, processor, tokenizer, facts = from_checkpoint(ref)
    return model.eval(), processor, tokenizer, facts


PHASE_KEYS = ("steps", "lr", "read_first", "mix", "finish_mix", "finish_share", "reason_tiers", "direct_tiers",
              "attend", "count_attend", "count_readout", "trace_attend", "trace_readout", "trace_kinds",
              "trace_heads", "number_init", "computed_weight", "answer_weight")


def load_schedule(path: str | Path) -> list[dict]:
    """The phases of a `--schedule` file: a JSON list, each phase a stage's settings (steps, lr, mix and
    optionally read_first, finish_mix, finish_share, reason_tiers, direct_tiers, attend, count_attend — the
    counting and copying heads' weight, `attend` unless given —, count_readout, `CountLens`'s weight,
    trace_attend, the trace's copying heads' weight, trace_readout, what the copy head copies said at
    its layer's output, trace_kinds, the kinds of `traced_copies` those two teach, `TRACE_KINDS` unless
    given, trace_heads, {kind: [layer, head]} for kinds taught at another head than `TRACE_HEADS`, and,
    read from the first phase as the run's start, number_init, `init_number_embeddings`; computed_weight,
    how many times a copied word the numbers a trace computes weigh in the loss, `computed_numbers`;
    answer_weight, the same for the answer after a reasoning target's trace),
    checked here so a typo fails before the first step, not after ten minutes."""
    phases = json.loads(Path(path).read_text())
    if not isinstance(phases, list) or not phases:
        raise ValueError(f"{path}: a schedule is a non-empty JSON list of phases")
    for n, phase in enumerate(phases, 1):
        if unknown := set(phase) - set(PHASE_KEYS):
            raise ValueError(f"{path}: phase {n} has unknown keys {sorted(unknown)}; known: {', '.join(PHASE_KEYS)}")
        if not (isinstance(phase.get("steps"), int) and phase["steps"] > 0 and phase.get("lr", 0) > 0
                and phase.get("mix")):
            raise ValueError(f"{path}: phase {n} needs steps (> 0), lr (> 0) and a mix")
        for key in ("mix", "finish_mix"):
            if unknown := set(phase.get(key) or {}) - set(OBJECTIVES):
                raise ValueError(f"{path}: phase {n}'s {key} names unknown objectives {sorted(unknown)}")
        if unknown := (set(phase.get("trace_kinds", ())) | set(phase.get("trace_heads", {}))) - set(TRACE_HEADS):
            raise ValueError(f"{path}: phase {n}'s trace_kinds or trace_heads names unknown kinds {sorted(unknown)}")
        for kind, where in phase.get("trace_heads", {}).items():
            if not (isinstance(where, list) and len(where) == 2 and all(isinstance(x, int) and x >= 0 for x in where)):
                raise ValueError(f"{path}: phase {n}'s trace_heads gives {kind} {where!r}, not [layer, head]")
        for key in ("computed_weight", "answer_weight"):
            if not (isinstance(phase.get(key, 1.0), (int, float)) and phase.get(key, 1.0) > 0):
                raise ValueError(f"{path}: phase {n}'s {key} must be a number > 0")
        for key in ("reason_tiers", "direct_tiers"):
            if unknown := set(phase.get(key) or {}) - set(TIERS):
                raise ValueError(f"{path}: phase {n}'s {key} names unknown tiers {sorted(unknown)}")
    return [phase_settings(phase) for phase in phases]


def phase_settings(phase: dict) -> dict:
    """A phase with every setting it leaves out at its default (a schedule's, or the one phase of a run
    from the command line); the same phase again when it has them all."""
    return {"read_first": 0.0, "finish_mix": None, "finish_share": None, "reason_tiers": None,
            "direct_tiers": None, "attend": 0.0, "count_attend": phase.get("attend", 0.0), "count_readout": 0.0,
            "trace_attend": 0.0, "trace_readout": 0.0, "trace_kinds": TRACE_KINDS, "computed_weight": 1.0,
            "answer_weight": 1.0, **phase,
            "trace_heads": trace_heads(phase)}


def trace_heads(phase: dict) -> dict[str, tuple[int, int]]:
    """{kind: (layer, head)} a phase teaches each kind of a trace's copies at: `TRACE_HEADS` unless its
    `trace_heads` moves some."""
    return {**TRACE_HEADS, **{kind: tuple(where) for kind, where in phase.get("trace_heads", {}).items()}}


def trace_attention_loss(tracers: dict, phase: dict, copies: dict):
    """(mean, added): the attention losses of the kinds of a trace's copies a phase teaches, found in
    a batch — the mean over the kinds, and the sum of `ADDED_KINDS`' own, outside that mean (None when
    a part has none). `tracers` holds a `PointerProbe` per (layer, head) of the phase's `trace_heads`."""
    found = [(kind, rows) for kind, rows in copies.items()
             if kind in phase["trace_kinds"] and rows is not None and len(rows)]
    losses = {kind: tracers[phase["trace_heads"][kind]].loss(rows) for kind, rows in found}
    averaged = [x for kind, x in losses.items() if kind not in ADDED_KINDS]
    added = [x for kind, x in losses.items() if kind in ADDED_KINDS]
    return (sum(averaged) / len(averaged) if averaged else None), (sum(added) if added else None)


def weighs(phase: dict, *losses: str) -> bool:
    """Whether a phase gives any of these auxiliary losses a weight (a phase from the command line
    names none of them)."""
    return any(phase.get(name, 0.0) > 0 for name in losses)


def phase_of(phases: list[dict], step: int) -> tuple[int, int]:
    """(phase index, step within that phase) of a run's step."""
    for index, phase in enumerate(phases):
        if step < phase["steps"]:
            return index, step
        step -= phase["steps"]
    raise IndexError("step past the schedule's end")


def train(role: str, out: Path, *, steps: int, lr: float, read_first: float = 0.25, batch_size: int = 32,
          seed: int = 0, tokenizer=None, bf16: bool = False, progress: bool = True,
          mix: dict[str, float] | None = None, reason_tiers: dict[str, float] | None = None,
          direct_tiers: dict[str, float] | None = None,
          finish_mix: dict[str, float] | None = None, finish_share: float | None = None,
          init_from: str | None = None, data_workers: int = 1, phases: list[dict] | None = None,
          schedule_file: str | None = None, procs: int = 1, rank: int = 0, port: int = 0) -> dict | None:
    """Train one role — from scratch, or on from the checkpoint `init_from` (its weights and tokenizer) —
    and save it to out; returns the facts for its model card. `phases` (a `--schedule`) chains stages in
    one run: each phase is what a later stage was (its steps, peak LR, mix and tiers, a fresh AdamW, its
    own warm-up and cosine), on from the phase before without a checkpoint between; the other
    settings then come from the first phase. `procs` > 1 trains data-parallel in that many processes
    (one core each, `rank` 0 this one): each takes its share of every batch's rows and the gradients
    are averaged before each step; rank 0 saves and returns the facts, the others return None."""
    import torch
    import transformers
    from tqdm import tqdm

    settings = {k: v for k, v in locals().items() if k not in ("torch", "transformers", "tqdm")}

    if not phases:
        phases = [dict(steps=steps, lr=lr, read_first=read_first, mix=mix, finish_mix=finish_mix,
                       finish_share=finish_share, reason_tiers=reason_tiers, direct_tiers=direct_tiers)]
    phases = [{**phase_settings(p), **dict(zip(("mix", "finish_mix", "finish_share"),
                                               role_schedule(role, p["mix"], p["finish_mix"], p["finish_share"])))}
              for p in phases]
    first, total = phases[0], sum(p["steps"] for p in phases)
    if procs < 1 or batch_size % procs:
        raise ValueError(f"a batch of {batch_size} does not split into {procs} equal shares")
    torch.manual_seed(seed)
    if init_from:
        model, processor, tokenizer, base = from_checkpoint(init_from)
    else:
        tokenizer = tokenizer or build_task_tokenizer(seed)
        model, processor, tokenizer = new_tiny(TRAINED_SIZES[role], tokenizer, seed)
        init_vision_positions(model)
        if first.get("number_init"):
            init_number_embeddings(model, tokenizer)
        base = None
    children, store = [], None
    if procs > 1:
        if rank == 0:
            store = host_store(procs)
            port = store.port
            children = start_ranks({**settings, "tokenizer": None if init_from else tokenizer}, port)
        join_ranks(model, rank, procs, port, store)
    batch_vision_attention(model)
    batcher = Batcher(role, tokenizer, processor.image_processor, model.config.image_token_id,
                      seed=seed * 2 + (role == "large"), reason_tiers=first["reason_tiers"],
                      direct_tiers=first["direct_tiers"], shard=(rank, procs))
    model.train()
    losses, start, items = [], time.perf_counter(), 0
    probe = PointerProbe(model) if any(weighs(p, "attend", "count_attend") for p in phases) else None
    counter = PointerProbe(model, layer=COUNT_LAYER, head=COUNT_HEAD) if probe else None
    copier = PointerProbe(model, layer=COPY_LAYER, head=COPY_HEAD) if probe else None
    tracers = {(layer, head): PointerProbe(model, layer=layer, head=head)
               for p in phases if weighs(p, "trace_attend") for layer, head in p["trace_heads"].values()}
    lens = CountLens(model) if any(weighs(p, "count_readout", "trace_readout") for p in phases) else None
    pointed, tallied, read, traced, said = [], [], [], [], []

    def plan(step: int) -> tuple[dict, dict, bool]:
        phase, at = phase_of(phases, step)
        p = phases[phase]
        return (mix_at(at, p["steps"], p["read_first"], p["mix"], p["finish_mix"], p["finish_share"]),
                {"reason": p["reason_tiers"], "direct": p["direct_tiers"]},
                weighs(p, "attend", "count_attend", "trace_attend", "trace_readout") or p["computed_weight"] != 1
                or p["answer_weight"] != 1)

    stream = batch_stream(batcher, total, batch_size, workers=data_workers, schedule=plan)
    bar = tqdm(stream, total=total, desc=f"train {role}", disable=not progress or rank > 0, mininterval=2)
    for step, (batch, items) in enumerate(bar):
        phase, at = phase_of(phases, step)
        p = phases[phase]
        if at == 0:  # each phase a fresh AdamW, as each stage was
            optim = torch.optim.AdamW(model.parameters(), lr=p["lr"], betas=(0.9, 0.98), weight_decay=0.01)
        for group in optim.param_groups:
            group["lr"] = lr_at(at, p["steps"], p["lr"], warmup=max(1, p["steps"] // 20))
        labels, pointers, counters = batch.pop("labels"), batch.pop("pointers", None), batch.pop("counters", None)
        copies, readouts, computed = batch.pop("copies", None), batch.pop("readouts", None), batch.pop("computed", None)
        answered = batch.pop("answered", None)
        weights = None
        for key, where in (("computed_weight", computed), ("answer_weight", answered)):
            if p[key] != 1 and where is not None and len(where):
                weights = torch.ones(labels[:, 1:].shape) if weights is None else weights
                weights[where[:, 0], where[:, 1]] = p[key]
        trace_copies = {kind: batch.pop(f"{kind}_copies", None) for kind in TRACE_HEADS}
        said_copies = {kind: batch.pop(f"{kind}_readouts", None) for kind in SAID_KINDS}
        # a phase's readout says the kinds it teaches, in the order they always were
        copy_readouts = [r for kind, r in said_copies.items() if kind in p["trace_kinds"] and r is not None]
        copy_readouts = torch.cat(copy_readouts) if copy_readouts else None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = answer_loss(model, batch, labels, weights)
            if not weighs(p, "attend", "count_attend"):
                pointers = counters = copies = None  # a phase that points only at the trace's copies
            if pointers is not None and len(pointers):
                aux = probe.loss(pointers)
                pointed.append(aux.item())
                loss = loss + p["attend"] * aux
            if counters is not None and len(counters):
                aux = counter.loss(counters)
                tallied.append(aux.item())
                loss = loss + p.get("count_attend", p["attend"]) * aux
            if copies is not None and len(copies):
                loss = loss + p.get("count_attend", p["attend"]) * copier.loss(copies)
            if weighs(p, "trace_attend"):
                mean, added = trace_attention_loss(tracers, p, trace_copies)
                if mean is not None:
                    traced.append(mean.item())
                    loss = loss + p["trace_attend"] * mean
                if added is not None:
                    loss = loss + p["trace_attend"] * added
            if weighs(p, "trace_readout") and copy_readouts is not None and len(copy_readouts):
                aux = lens.loss(copy_readouts)
                said.append(aux.item())
                loss = loss + p["trace_readout"] * aux
            if lens is not None and weighs(p, "count_readout") and readouts is not None and len(readouts):
                aux = lens.loss(readouts)
                read.append(aux.item())
                loss = loss + p["count_readout"] * aux
        optim.zero_grad(set_to_none=True)
        loss.backward()
        if procs > 1:
            loss = average_gradients(model, loss, procs)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        losses.append(loss.item())
        if step % 10 == 0:
            shown = {"loss": losses, "pointer": pointed, "count": tallied, "readout": read, "trace": traced, "said": said}
            bar.set_postfix(**{name: f"{sum(xs[-10:]) / len(xs[-10:]):.3f}" for name, xs in shown.items() if xs})
    model.eval()
    seconds = time.perf_counter() - start
    if procs > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
        for process in children:
            process.join()
            if process.exitcode:
                raise RuntimeError(f"a training process exited with {process.exitcode}")
        if rank:
            return None
    window = max(1, min(50, first["steps"] // 5))
    save_checkpoint(out, model, processor, tokenizer)
    facts = {"role": role, "reasoning_format": FORMATS[role], "steps": first["steps"], "batch_size": batch_size,
             "examples": first["steps"] * batch_size, "items": items, "lr": first["lr"], "seed": seed,
             "bf16_autocast": bf16, "threads": torch.get_num_threads(), "data_workers": data_workers,
             **({"procs": procs} if procs > 1 else {}),
             "train_seconds": round(seconds, 1), "cpu": cpu_facts(), "transformers": transformers.__version__,
             "parameters": sum(p.numel() for p in model.parameters()),
             "sizes": {k: v for k, v in TRAINED_SIZES[role].items() if k != "thinking"},
             "read_first": first["read_first"], "mix": first["mix"],
             "reason_tiers": first["reason_tiers"],  # None: the task's own mix
             **({"direct_tiers": first["direct_tiers"]} if first["direct_tiers"] else {}),
             "finish_mix": first["finish_mix"], "finish_share": first["finish_share"] if first["finish_mix"] else None,
             "random_access_p": RANDOM_ACCESS_P,
             "corrupt_hint_p": CORRUPT_P if "transfer" in first["mix"] else None,
             # The supervised attention's weight (PointerProbe); the losses below then include it.
             **({"attend": first["attend"]} if first.get("attend") else {}),
             **({"count_attend": first["count_attend"]} if first.get("count_attend", first.get("attend")) != first.get("attend") else {}),
             **({"count_readout": first["count_readout"]} if first.get("count_readout") else {}),
             **({"trace_attend": first["trace_attend"]} if first.get("trace_attend") else {}),
             **({"trace_readout": first["trace_readout"]} if first.get("trace_readout") else {}),
             **({"number_init": True} if first.get("number_init") else {}),
             **({"computed_weight": first["computed_weight"]} if first["computed_weight"] != 1 else {}),
             **({"answer_weight": first["answer_weight"]} if first["answer_weight"] != 1 else {}),
             # Mean loss over the first and the last 50 steps (a fifth of a shorter run).
             "loss_first": round(sum(losses[:window]) / window, 4),
             "loss_last": round(sum(losses[-window:]) / window, 4),
             "prompt_fingerprint": prompts.template_fingerprint(),
             # The count questions' options (benchmarks/grid.py): runs before the fix lack this fact.
             "count_options": COUNT_OPTIONS}
    if len(phases) > 1:
        # A chained run: each phase's settings and the mean loss over its first and last 50 steps.
        ends = [sum(p["steps"] for p in phases[:i + 1]) for i in range(len(phases))]
        facts.update(steps=total, examples=total * batch_size, schedule=schedule_file, phases=[
            {**p, "loss_first": round(sum(losses[e - p["steps"]:e - p["steps"] + 50]) / min(50, p["steps"]), 4),
             "loss_last": round(sum(losses[max(e - 50, e - p["steps"]):e]) / min(50, p["steps"]), 4)}
            for p, e in zip(phases, ends)])
    if init_from:
        # The checkpoint trained on (its own facts, nested): a card describes both stages.
        facts["init_from"], facts["base"] = init_from, base
    (Path(out) / "training.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


def host_store(world: int):
    """Rank 0's rendezvous store for a data-parallel run of `world` ranks, listening on a port the OS
    picks and holding it from then on (`.port`): a port found free and bound later can be taken in
    between — a CI run lost one so, EADDRINUSE, with Ray's processes starting beside it."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timedelta(minutes=10),
                         wait_for_workers=False)


def store_at(port: int, world: int):
    """A client of the rendezvous store `host_store` holds at `port`."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(minutes=10))


def start_ranks(settings: dict, port: int) -> list:
    """Ranks 1.. of a data-parallel run, each a spawned process running `train` with these settings
    and the threads of this one, meeting on rank 0's store at `port`."""
    import torch
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    children = []
    for rank in range(1, settings["procs"]):
        process = context.Process(target=_rank_main, args=({**settings, "rank": rank, "port": port},
                                                          torch.get_num_threads()))
        process.start()
        children.append(process)
    return children


def _rank_main(settings: dict, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    train(**settings)


def join_ranks(model, rank: int, world: int, port: int, store=None) -> None:
    """Meet the other ranks on rank 0's store — `store` on rank 0, which hosts it (`host_store`),
    the one at `port` on the others — and start from rank 0's weights (the same seed made the same
    ones; this makes sure)."""
    from datetime import timedelta

    import torch.distributed as dist

    if store is None:  # rank 0 hosts it; the others join it as clients (both sides pass the store)
        store = store_at(port, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(minutes=10))
    for p in model.parameters():
        dist.broadcast(p.data, 0)


def average_gradients(model, loss, world: int):
    """Every rank's gradients (and loss) averaged in one all-reduce: each rank's loss is the mean over
    its equal share of the batch's rows, so the average is the whole batch's loss and gradient."""
    import torch
    import torch.distributed as dist

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
    dist.all_reduce(flat)
    flat /= world
    at = 0
    for g in grads:
        g.copy_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()
    return flat[-1]


ROLE_TITLES = {"small": "small reasoner (think-tags reasoning, like Qwen3-VL-2B-Thinking)",
               "large": "large answerer (prompted reasoning, like Qwen3-VL-8B-Instruct)"}


def accuracy_table(results: dict) -> str:
    """Markdown rows of a strategies report: accuracy with its interval, per tier, latency, tokens."""
    lines = ["| row | accuracy (95 % CI) | perceive | count | compose | p50 ms | output tokens | transfer rate |",
             "|---|---|---|---|---|---|---|---|"]
    pct = lambda x: "–" if x is None else f"{x:.1%}"  # noqa: E731
    for r in results["rows"]:
        tiers = r["accuracy_by_tier"]
        lines.append(f"| `{r['name'].replace('|', '/')}` | {pct(r['accuracy'])} ({r['accuracy_ci95'][0]:.1%}–{r['accuracy_ci95'][1]:.1%}) | "
                     f"{pct(tiers.get('perceive'))} | {pct(tiers.get('count'))} | {pct(tiers.get('compose'))} | "
                     f"{r['p50_ms']:.0f} | {r['output_tokens']:.1f} | {r['transfer_rate']:.0%} |")
    return "\n".join(lines)


def mix_text(mix: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0%}" for k, v in mix.items())


def stage_chain(facts: dict) -> list[dict]:
    """A checkpoint's training stages, first to last: each --init-from run nests the facts of the
    checkpoint it started from under `base`."""
    chain = []
    while facts:
        chain.append(facts)
        facts = facts.get("base")
    return chain[::-1]


def stage_command(role: str, stage: dict, later: bool) -> str:
    """The train_tiny command line that reproduces one stage (a later one from BASE, the stage before)."""
    shares = lambda d: ",".join(f"{k}={v}" for k, v in d.items())  # noqa: E731
    parts = [f"python -m benchmarks.train_tiny --role {role} --threads {stage['threads']}"]
    if stage.get("procs", 1) > 1:
        parts.append(f"--procs {stage['procs']}")
    if stage["seed"]:
        parts.append(f"--seed {stage['seed']}")
    if stage.get("batch_size", DEFAULTS[role]["batch_size"]) != DEFAULTS[role]["batch_size"]:
        parts.append(f"--batch-size {stage['batch_size']}")
    if stage.get("phases"):
        return " ".join(parts + (["--init-from BASE"] if later else []) + [f"--schedule {stage['schedule']}"])
    if later:
        parts.append("--init-from BASE")
    if later or (stage["steps"], stage["lr"]) != (DEFAULTS[role]["steps"], DEFAULTS[role]["lr"]):
        parts.append(f"--steps {stage['steps']} --lr {stage['lr']}")
    # An explicit --mix drops the role's finishing mix: name both whenever either is not the default.
    if later or (stage["mix"], stage.get("finish_mix")) != (MIX[role], FINISH_MIX[role]):
        parts.append(f"--mix {shares(stage['mix'])}")
        if stage.get("finish_mix"):
            parts.append(f"--finish-mix {shares(stage['finish_mix'])} --finish-share {stage['finish_share']}")
    for flag, key in (("--direct-tiers", "direct_tiers"), ("--reason-tiers", "reason_tiers")):
        if stage.get(key):
            parts.append(f"{flag} {shares(stage[key])}")
    return " ".join(parts)


def tiers_text(settings: dict) -> str:
    """The tier mixes a stage or phase set, as card text ("; direct-answer tiers: ...")."""
    return "".join(f"; {name} tiers: {mix_text(settings[key])}" for name, key in
                   (("direct-answer", "direct_tiers"), ("reasoning", "reason_tiers")) if settings.get(key))


def phase_lines(run: dict) -> list[str]:
    """Card lines for a run chained in phases (`--schedule`): what each later phase trained on."""
    phases = run.get("phases") or []
    if not phases:
        return []
    lines = [f"- One run in {len(phases)} phases (`--schedule {run['schedule']}`): each phase a fresh AdamW with "
             "its own warm-up and cosine, on from the phase before; items fresh throughout; loss per phase "
             + ", ".join(f"{p['loss_first']} -> {p['loss_last']}" for p in phases) + "."]
    for n, p in enumerate(phases[1:], 2):
        lines.append(f"- Phase {n}: {p['steps']} steps, peak LR {p['lr']}, mix: {mix_text(p['mix'])}"
                     + tiers_text(p)
                     + ".")
    return lines


def write_card(folder: Path, results: dict | None) -> None:
    """README.md beside the weights: what the model is, what it learned from, how it scores."""
    facts = json.loads((folder / "training.json").read_text())
    role, text, vision = facts["role"], facts["sizes"]["text"], facts["sizes"]["vision"]
    # A model trained on from another checkpoint (--init-from) is described stage by stage, from the
    # first (from scratch) to the last.
    stages = stage_chain(facts)
    first, *later = stages
    minutes = sum(s["train_seconds"] for s in stages) / 60
    old_options = [i + 1 for i, s in enumerate(stages) if not s.get("count_options")]
    card = [f"# Tandem trained tiny Qwen3-VL: {ROLE_TITLES[role]}", "",
            "`Qwen3VLForConditionalGeneration` (the real architecture), trained from scratch on CPU on Tandem's "
            "synthetic grid task so that the paper's findings can be measured offline. Load it with "
            f"`from_pretrained` like any checkpoint, or name it `trained:{role}` in a Tandem config.", "",
            "## Architecture", "",
            f"- {facts['parameters']:,} parameters; text: hidden {text['hidden_size']}, {text['num_hidden_layers']} layers, "
            f"{text['num_attention_heads']} heads ({text['num_key_value_heads']} KV), head_dim {text['head_dim']}, "
            f"MLP {text['intermediate_size']}; vision: {vision['depth']} layers x {vision['hidden_size']}, "
            f"DeepStack taps {vision['deepstack_visual_indexes']}; patch 16, merge 2.",
            "- Tokenizer: byte-level BPE (1,024 tokens) trained on the task's text (the same recipe for both "
            "models); Qwen's special tokens and ChatML template.", "",
            "## Task and data", "",
            "`benchmarks/grid.py`: 4 x 4 grids of flat colours (6 colours + white), 32 px cells = one visual "
            "token per cell; multiple choice A-D answered with the option's text; tiers perceive 50 % "
            "(colour of a cell, is there a colour), count 25 %, compose 25 % (sum of a row of per-colour "
            "values, modulo 10). Programmatic reasoning traces."
            + ("" if not old_options else
               f" Stage{'s' if len(old_options) > 1 else ''} {', '.join(map(str, old_options))} trained on count "
               "questions whose options were the count and three of the seven numbers centred on it (until "
               "2026-12-01): the option nearest the options' mean was the count on 61 % of count items, and the "
               "direct counts learned that (benchmarks/LEVERS.md, the count options' leak)"
               + ("; the later stages on the task as it is now" if len(old_options) < len(stages) else "")
               + ". The accuracy below is on the task as it is now: four neighbouring numbers, the count at any "
               "place among them."),
            f"- {first['examples']:,} training examples ({first['steps']} steps x batch {first['batch_size']}), "
            f"one fresh item each (training item seeds < 2^40; held-out items start at 2^40).",
            *phase_lines(first)[:1],
            f"- Curriculum{' (phase 1)' if first.get('phases') else ''}: the first {first['read_first']:.0%} of the "
            "steps are captions only; then one objective "
            f"per batch (the objectives: `benchmarks/train_tiny.py`'s docstring), drawn from the mix: "
            f"{mix_text(first['mix'])}"
            + (f"; the last {first['finish_share']:.0%} from the finishing mix: {mix_text(first['finish_mix'])}"
               if first.get("finish_mix") else "")
            + (f"; {first['corrupt_hint_p']:.0%} of transfer hints misread one cell (target: the true answer)."
               if first.get("corrupt_hint_p") else ".")]
    card += phase_lines(first)[1:]
    for n, stage in enumerate(later, 2):
        card.append(f"- Stage {n}, trained on from stage {n - 1}'s checkpoint: {stage['steps']} steps x batch "
                    f"{stage['batch_size']} ({stage['examples']:,} examples, items from the start of the same "
                    f"training stream), peak LR {stage['lr']}, mix: {mix_text(stage['mix'])}"
                    + (f"; the last {stage['finish_share']:.0%} from: {mix_text(stage['finish_mix'])}"
                       if stage.get("finish_mix") else "")
                    + tiers_text(stage)
                    + ".")
    card += [f"- Reasoning format: `{facts['reasoning_format']}`. Prompts: `tandem/prompts.py`, fingerprint "
             f"`{facts['prompt_fingerprint']}` (a test fails when the templates change: retrain then).", "",
             "## Training", "",
             f"AdamW (betas 0.9/0.98, weight decay 0.01), peak LR {first['lr']}, 5 % warm-up then cosine to 10 %, "
             f"gradient clip 1.0, {'bf16 autocast' if first['bf16_autocast'] else 'fp32'}, seed {first['seed']}; "
             f"per-sequence mean cross-entropy on the answer side only; vision position table started as a 2D "
             f"sin-cos grid. {first['train_seconds'] / 60:.1f} min with {first['threads']} torch thread(s)"
             + (f" in each of {first['procs']} data-parallel processes (each on its share of every batch's rows, "
                f"the gradients averaged)" if first.get("procs", 1) > 1 else "")
             + f"{' (batches made in a second process)' if first.get('data_workers') else ''} on the "
             f"2-core development machine{' (' + first['note'] + ')' if first.get('note') else ''}; loss "
             f"{first['loss_first']} (first 50 steps) -> {first['loss_last']} (last 50)."
             + (" Each later stage: a fresh AdamW with the same settings, warm-up and cosine over its own steps; "
                + "; ".join(f"stage {n} {s['train_seconds'] / 60:.1f} min, loss {s['loss_first']} -> {s['loss_last']}"
                            for n, s in enumerate(later, 2))
                + f"; {minutes:.1f} min in all." if later else ""), "",
             (f"Reproduce, at commit {first['code_commit']} ({first['code_note']}): `{stage_command(role, first, False)}`"
              if first.get("code_commit") else f"Reproduce: `{stage_command(role, first, False)}`")
             + "".join(f"; then stage {n}, with BASE the stage before"
                       + (f" ({s['base_note']})" if s.get("base_note") else "")
                       + (f", at commit {s['code_commit']}" + (f" ({s['code_note']})" if s.get("code_note") else "")
                          if s.get("code_commit") else "")
                       + f": `{stage_command(role, s, True)}`" for n, s in enumerate(later, 2)), ""]
    if results:
        card += ["## Accuracy (held-out grid items, through Tandem's own pipeline)", "",
                 f"`python -m benchmarks.strategies --dataset grid --n {results['n']}` "
                 "(the trained pair in both roles; one CPU machine, 2 cores):", "",
                 accuracy_table(results), ""]
        if results.get("findings"):
            card += ["Findings (bars from the Fidelity issue):", ""]
            card += [f"- {k}: {'met' if v['met'] else 'NOT met'} — "
                     + ", ".join(f"{n} {x}" for n, x in v.items() if n != "met") for k, v in results["findings"].items()]
            card.append("")
            f3 = results["findings"].get("F3", {})
            if f3.get("gap_inside_large_reasoning_ci95"):
                card += [f"F3's ratio divides by the gap between `large_reasoning` and `large`: "
                         f"{f3['gap_large_reasoning_minus_large']:.1%} here, inside `large_reasoning`'s 95 % interval, "
                         "so the ratio is noise whatever it says — the large model's own reasoning is barely a ceiling "
                         "above its direct answers (main README, F3).", ""]
        if role == "large" and results.get("corrupted_hints"):
            h = results["corrupted_hints"]["all"]
            card += [f"Given a hint that misreads one cell (and so points at a wrong option), this model followed it "
                     f"on {h['followed_corrupted']:.1%} of {h['n']} held-out items and kept the true answer on "
                     f"{h['kept_true_answer']:.1%} (with a clean hint: {h['accuracy_with_clean_hint']:.1%} right).", ""]
    (folder / "README.md").write_text("\n".join(card))


OBJECTIVES = ("direct", "reason", "transfer", "caption", "lookup", "tally", "census")


def parse_shares(known: tuple[str, ...]):
    """An argparse type: "a=0.3,b=0.7" over the known names."""
    def parse(text: str) -> dict[str, float]:
        shares = {}
        for part in text.split(","):
            name, _, share = part.partition("=")
            if name.strip() not in known:
                raise argparse.ArgumentTypeError(f"unknown name {name.strip()!r}; known: {', '.join(known)}")
            shares[name.strip()] = float(share)
        return shares
    return parse


def share(text: str) -> float:
    """An argparse type: a share of the steps, from 0 to 1."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a share from 0 to 1; got {text}")
    return value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["small", "large", "both"], default="both")
    ap.add_argument("--out", default=str(TRAINED_DIR), help="folder of the role folders (default: the shipped pair)")
    ap.add_argument("--steps", type=int, help="default: per role (small 3000, large 4000)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1, as the shipped pair: another count rounds floats otherwise "
                         "and gives other weights; for the large model, a worse one, see benchmarks/LEVERS.md)")
    ap.add_argument("--data-workers", type=int, choices=[0, 1],
                    help="processes that draw and tokenize the next batches while a step trains (default 1: "
                         "the second core; 0: inline, the same weights, slower; with --procs 2 the default is "
                         "0: both cores train)")
    ap.add_argument("--procs", type=int, default=1,
                    help="training processes, data-parallel (default 1; 2: one per core of this machine, "
                         "each on half of every batch: other float rounding and other rows than one process)")
    ap.add_argument("--lr", type=float, help="peak learning rate; default per role")
    ap.add_argument("--batch-size", type=int, help="default: per role (small 32, large 16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bf16", action="store_true",
                    help="bf16 autocast (≈10 %% faster for the large model here; fp32 by default)")
    ap.add_argument("--mix", type=parse_shares(OBJECTIVES),
                    help="objectives' shares after the first reading steps, e.g. "
                         "direct=0.3,reason=0.5,caption=0.1,lookup=0.1; default per role (MIX)")
    ap.add_argument("--finish-mix", type=parse_shares(OBJECTIVES),
                    help="another mix for the last --finish-share of the steps (e.g. direct-heavy after a "
                         "reasoning-heavy mix); default per role (FINISH_MIX: the large model's), none "
                         "when --mix is given")
    ap.add_argument("--finish-share", type=share,
                    help=f"the finishing mix's share of the steps (default: large 0.1, else {FINISH_SHARE})")
    ap.add_argument("--reason-tiers", type=parse_shares(TIERS),
                    help="tiers of the reasoning examples, e.g. perceive=0.2,count=0.4,compose=0.4; "
                         "default the task's mix")
    ap.add_argument("--direct-tiers", type=parse_shares(TIERS),
                    help="tiers of the direct-answer examples, as --reason-tiers; default the task's mix")
    ap.add_argument("--init-from", metavar="MODEL",
                    help="train on from this checkpoint (a path or trained:ROLE; its tokenizer, no reading-only "
                         "first steps) instead of from scratch")
    ap.add_argument("--schedule", metavar="JSON",
                    help="chain stages in one run: a JSON list of phases, each a stage's steps, lr, mix and "
                         "tiers (benchmarks/schedules/); replaces --steps, --lr, --mix and the tier flags")
    ap.add_argument("--card", metavar="STRATEGIES_JSON",
                    help="only (re)write the model cards, with the accuracy table of this strategies.json")
    args = ap.parse_args(argv)
    roles = ["small", "large"] if args.role == "both" else [args.role]
    if args.card:
        results = json.loads(Path(args.card).read_text())
        for role in roles:
            write_card(Path(args.out) / role, results)
        return 0
    phases = None
    if args.schedule:
        if len(roles) > 1:
            ap.error("a schedule trains one role: give --role small or --role large")
        given = [f for f, v in (("--steps", args.steps), ("--lr", args.lr), ("--mix", args.mix),
                                ("--finish-mix", args.finish_mix), ("--finish-share", args.finish_share),
                                ("--reason-tiers", args.reason_tiers), ("--direct-tiers", args.direct_tiers))
                 if v is not None]
        if given:
            ap.error(f"--schedule sets every phase's settings; drop {', '.join(given)}")
        try:
            phases = load_schedule(args.schedule)
        except (OSError, ValueError) as e:
            ap.error(str(e))
    batch_sizes = [args.batch_size or DEFAULTS[role]["batch_size"] for role in roles]
    if args.procs < 1 or any(size % args.procs for size in batch_sizes):
        ap.error(f"--procs {args.procs}: each batch ({', '.join(map(str, batch_sizes))}) must split into that many "
                 "equal shares")
    import torch

    torch.set_num_threads(args.threads)
    if args.init_from and len(roles) > 1:
        ap.error("--init-from continues one checkpoint: give --role small or --role large")
    tokenizer = None if args.init_from else build_task_tokenizer(args.seed)
    for role in roles:
        d = DEFAULTS[role]
        facts = train(role, Path(args.out) / role, steps=args.steps or d["steps"], lr=args.lr or d["lr"],
                      read_first=0.0 if args.init_from else d["read_first"],
                      batch_size=args.batch_size or d["batch_size"], seed=args.seed,
                      tokenizer=tokenizer, bf16=args.bf16, mix=args.mix,
                      reason_tiers=args.reason_tiers, direct_tiers=args.direct_tiers, finish_mix=args.finish_mix,
                      finish_share=args.finish_share, init_from=args.init_from,
                      data_workers=(1 if args.procs == 1 else 0) if args.data_workers is None else args.data_workers,
                      phases=phases, schedule_file=args.schedule, procs=args.procs)
        write_card(Path(args.out) / role, None)
        print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
