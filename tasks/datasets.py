"""Visual-question datasets for the benchmarks: a seeded synthetic generator that ships with the
project (rendered shapes, digits and colours with exact answers and four options), a JSONL format,
and an MMBench-style TSV loader for users who have the file locally."""

from __future__ import annotations

import base64
import csv
import io
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

LETTERS = "ABCD"
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (235, 200, 30)}
SHAPES = ("circle", "square", "triangle")


@dataclass(frozen=True)
class Item:
    image: bytes
    question: str
    options: tuple[str, ...]
    answer: str  # the correct option's letter
    tier: str = ""  # a dataset's own difficulty class (the grid task: perceive, count, compose)

    def prompt(self) -> str:
        lines = [self.question, "Options:"] + [f"{LETTERS[i]}. {o}" for i, o in enumerate(self.options)]
        return "\n".join(lines)


def _png(draw_fn, size=(160, 120)) -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, (245, 245, 240))
    draw_fn(ImageDraw.Draw(img))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def _draw_shape(d, shape: str, box: tuple[int, int, int, int], colour) -> None:
    x0, y0, x1, y1 = box
    if shape == "circle":
        d.ellipse(box, fill=colour)
    elif shape == "square":
        d.rectangle(box, fill=colour)
    else:
        d.polygon([((x0 + x1) // 2, y0), (x1, y1), (x0, y1)], fill=colour)


def _options(rng: random.Random, correct: str, pool: list[str]) -> tuple[tuple[str, ...], str]:
    others = rng.sample([p for p in pool if p != correct], 3)
    options = others + [correct]
    rng.shuffle(options)
    return tuple(options), LETTERS[options.index(correct)]


def _count_item(rng: random.Random) -> Item:
    shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
    n = rng.randint(1, 6)
    boxes = [(10 + 50 * (i % 3), 10 + 55 * (i // 3), 45 + 50 * (i % 3), 55 + 55 * (i // 3)) for i in range(n)]
    image = _png(lambda d: [_draw_shape(d, shape, b, COLOURS[colour]) for b in boxes])
    options, answer = _options(rng, str(n), [str(i) for i in range(1, 9)])
    return Item(image, f"How many {shape}s are in the image?", options, answer)


def _colour_item(rng: random.Random) -> Item:
    shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
    image = _png(lambda d: _draw_shape(d, shape, (50, 25, 110, 95), COLOURS[colour]))
    options, answer = _options(rng, colour, list(COLOURS))
    return Item(image, f"What colour is the {shape}?", options, answer)


def _digit_item(rng: random.Random) -> Item:
    from PIL import ImageFont

    digit = str(rng.randint(0, 9))
    font = ImageFont.load_default(size=72)
    image = _png(lambda d: d.text((55, 15), digit, fill=(20, 20, 20), font=font))
    options, answer = _options(rng, digit, [str(i) for i in range(10)])
    return Item(image, "Which digit is written in the image?", options, answer)


def synthetic(n: int, seed: int = 0) -> list[Item]:
    """n questions with exact answers; the same seed gives the same items, byte for byte."""
    rng = random.Random(seed)
    makers = (_count_item, _colour_item, _digit_item)
    return [makers[i % len(makers)](rng) for i in range(n)]


def load_jsonl(path: str | Path) -> list[Item]:
    """Lines of {"image": path relative to the file, or base64, "question", "options": [...], "answer": letter,
    optionally "tier"}."""
    path = Path(path)
    items = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            image = row["image"]
            data = (path.parent / image).read_bytes() if (path.parent / image).is_file() else base64.b64decode(image)
            items.append(Item(data, row["question"], tuple(row["options"]), row["answer"].strip().upper(),
                              row.get("tier", "")))
    return items


def load_mmbench_tsv(path: str | Path) -> list[Item]:
    """MMBench's TSV (index, question, hint, A-D, answer, image as base64); options that are empty
    are dropped, and the hint, when present, precedes the question."""
    csv.field_size_limit(sys.maxsize)
    items = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            options = tuple(row[k] for k in LETTERS if row.get(k) and row[k].lower() != "nan")
            hint = row.get("hint") or ""
            question = f"{hint}\n{row['question']}" if hint and hint.lower() != "nan" else row["question"]
            items.append(Item(base64.b64decode(row["image"]), question, options, row["answer"].strip().upper()))
    return items


def write_jsonl(items: list[Item], path: str | Path) -> None:
    with open(path, "w") as f:
        for it in items:
            f.write(json.dumps({"image": base64.b64encode(it.image).decode(), "question": it.question,
                                "options": list(it.options), "answer": it.answer,
                                **({"tier": it.tier} if it.tier else {})}) + "\n")
