"""Benchmark datasets: a seeded generator must give the same questions each run (or accuracy
figures can't be compared), answers must point at the right option, and the loaders must agree."""

import base64
import csv
import io

from PIL import Image

from tasks.datasets import LETTERS, load_jsonl, load_mmbench_tsv, synthetic, write_jsonl


def test_synthetic_is_seeded_and_well_formed():
    a, b, c = synthetic(12, seed=3), synthetic(12, seed=3), synthetic(12, seed=4)
    assert a == b and a != c
    for item in a:
        assert len(item.options) == 4 and len(set(item.options)) == 4 and item.answer in LETTERS
        assert Image.open(io.BytesIO(item.image)).size == (160, 120)
        assert item.prompt().endswith(f"D. {item.options[3]}")


def test_count_questions_answer_the_number_drawn():
    counts = [it for it in synthetic(30, seed=1) if it.question.startswith("How many")]
    assert counts
    for it in counts:
        assert it.options[LETTERS.index(it.answer)].isdigit()


def test_jsonl_round_trip(tmp_path):
    items = synthetic(5, seed=2)
    write_jsonl(items, tmp_path / "d.jsonl")
    assert load_jsonl(tmp_path / "d.jsonl") == items


def test_mmbench_tsv(tmp_path):
    item = synthetic(1)[0]
    path = tmp_path / "mmbench.tsv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["index", "question", "hint", "A", "B", "C", "D", "answer", "image"])
        w.writerow([0, item.question, "nan", *item.options[:3], "nan", item.answer, base64.b64encode(item.image).decode()])
    loaded = load_mmbench_tsv(path)[0]
    assert loaded.question == item.question and loaded.options == item.options[:3] and loaded.image == item.image
