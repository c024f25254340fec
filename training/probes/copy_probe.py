"""Where a trained model's own traces lose a copied word: for each kind of copy a trace makes
(`training.train.traced_copies`), how much of its head's attention sits on the word it copies,
and how often the model, fed the program's trace up to there (teacher forcing), says the right word.

    python -m training.probes.copy_probe --model trained:large
    python -m training.probes.copy_probe --model /tmp/run/large --n 64

Kinds: `copy` — a word copied from the question (a compose step's value, a count trace's counted
colour); `sum` — a running sum or the total, at the sum it adds to; `addend` — the same running sum,
at what it adds (the value or the row's count just before it); `place` — a row or column number
copied from the question (a colour trace's "row 2, column 3", a compose trace's row); `asked` — an
any-question's colour; `verdict` — the answer after a trace, at the trace's total (or colour). Each is
measured on four kinds of example: colour traces (the perceive tier's, mostly a named cell's),
compose traces, count traces (the reasoning prompt) and the `lookup` objective (values named in the
text). `weight` is the mean attention the kind's head (`TRACE_HEADS`, or where the model's training
put it) gives the source word — high when the head was taught to point there, near zero otherwise —
and `right` the share of those positions whose greedy next token is the trace's. A kind whose head
points right and whose words are still wrong is losing the word after the attention (the copy's
value path, or a sum's arithmetic). Items: seeds from 3 * EVAL_SEED_BASE on, disjoint from training,
from `benchmarks.strategies`' held-out items and from `training.probes.count_probe`'s. The last line is
JSON: `{"benchmark": "copy_probe", "model", "n", "rows": {example: {kind: {"positions", "weight",
"right"}}}}`.
"""

from __future__ import annotations

import argparse
import json

from tasks.grid import EVAL_SEED_BASE

EXAMPLES = {"colour traces": ({"reason": 1.0}, {"perceive": 1.0}),
            "compose traces": ({"reason": 1.0}, {"compose": 1.0}),
            "count traces": ({"reason": 1.0}, {"count": 1.0}),
            "lookup": ({"lookup": 1.0}, None)}


def measure(model, processor, tokenizer, n: int, heads: dict | None = None) -> dict:
    """{example: {kind: {"positions", "weight", "right"}}} over n examples of each; heads: {kind: (layer,
    head)}, `TRACE_HEADS` unless given."""
    import torch

    from training.objectives import SAID_KINDS, TRACE_HEADS, PointerProbe

    from training.batches import Batcher

    heads = heads or TRACE_HEADS
    probes = {kind: PointerProbe(model, layer=layer, head=head) for kind, (layer, head) in heads.items()}
    rows = {}
    for name, (mix, tiers) in EXAMPLES.items():
        batcher = Batcher("large", tokenizer, processor.image_processor, model.config.image_token_id, seed=0,
                          reason_tiers=tiers, item_seed=lambda seed, i: 3 * EVAL_SEED_BASE + i)
        batcher.attend, batcher.mix = True, mix
        batch = batcher.batch(n)
        labels = batch.pop("labels")
        found = {kind: batch.pop(f"{kind}_copies") for kind in TRACE_HEADS}
        for key in ("pointers", "counters", "copies", "readouts", *(f"{kind}_readouts" for kind in SAID_KINDS)):
            batch.pop(key)
        with torch.no_grad():
            logits = model(**batch).logits
            rows[name] = {}
            for kind, at in found.items():
                if not len(at):
                    continue
                row, query, _ = at.unbind(1)
                # the probe's loss per position is minus the log of the head's weight on the source
                weight = torch.stack([(-probes[kind].loss(point[None])).exp() for point in at]).mean()
                right = (logits[row, query].argmax(-1) == labels[row, query + 1]).float().mean()
                rows[name][kind] = {"positions": len(at), "weight": round(float(weight), 3),
                                    "right": round(float(right), 3)}
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="trained:large", help="a checkpoint reference or path")
    parser.add_argument("--n", type=int, default=32, help="examples of each kind (one batch)")
    args = parser.parse_args(argv)

    from training.models import probed_model
    from training.schedule import trace_heads

    model, processor, tokenizer, facts = probed_model(args.model)
    # a run that moved a kind to another head (a phase's `trace_heads`) is probed at that head
    heads = trace_heads((facts or {}).get("phases", [{}])[-1])
    rows = measure(model, processor, tokenizer, args.n, heads)
    print(f"{args.model}: {args.n} held-out examples of each kind, teacher-forced")
    print(f"{'example':<16} {'kind':<7} {'positions':>9} {'weight':>7} {'right':>7}")
    for name, kinds in rows.items():
        for kind, r in kinds.items():
            print(f"{name:<16} {kind:<7} {r['positions']:>9} {r['weight']:>7.1%} {r['right']:>7.1%}")
    print(json.dumps({"benchmark": "copy_probe", "model": args.model, "n": args.n, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
