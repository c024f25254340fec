"""Where a trained model's reasoning traces go wrong on the grid task: each trace is compared word by
word with the program's, and its first wrong word is classed by the step that wrote it.

    python -m training.probes.trace_errors --role small --tier compose --n 60
    python -m training.probes.trace_errors --role large --tier count --config other.yaml
    python -m training.probes.trace_errors --role large --tier count --direct   # how far direct counts land

Steps: `colour` (a cell read from the image), `value` (a compose value copied from the question, or
a count's per-row figure), `sum` (a running total in parentheses), `end` (the trace stopped early),
anything else by its word; a trace that follows the program's to its end counts as right. Decoded
through Tandem's own stages and prompts, with the reasoning stage's request (prompt, stop, cap) as
the pipeline sends it, greedy (as the trained checkpoints' generation config decodes), on held-out
items. The last line is JSON:
`{"benchmark": "trace_errors", "role", "tier", "n", "exact", "first_wrong": {step: count}}`.

`--census`: the large model asked for every colour's count of each of `--n` held-out images at once
(the `census` objective's question) — a one-pass count without a question to route it; JSON
`{"benchmark": "census", "n", "colours", "right", "one_off"}` (white cells left out).

`--direct` (count items): the model's direct answer instead (the direct prompt, as `mutual`'s first
stage sends it) and, beside it, its answer after its own reasoning: how far each lands from the true
count — an answer one off is an estimate, not a misreading. JSON: `{"benchmark": "count_offsets",
"role", "n", "direct": {offset: count}, "reasoning": {offset: count}, "options_rule": {...}}` (offset =
answer − truth; "other" for an answer that is neither a number nor an option letter); `options_rule`:
how often the option nearest the options' mean is the count, how often the direct answer is that
option, and how often the direct answer is right where that option is not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from tasks.datasets import LETTERS
from tasks.grid import PALETTE, TIERS, GridItem, grid_items


def first_wrong(gold: str, text: str) -> str | None:
    """The step of the first word where `text` leaves the program's trace `gold`; None if it follows
    it to its end."""
    gw, tw = gold.split(), text.split()
    for g, t in zip(gw, tw):
        if g != t:
            return step_of(g)
    return None if len(tw) >= len(gw) else "end"


def step_of(word: str) -> str:
    bare = word.strip(".;,:")
    if bare in PALETTE:
        return "colour"
    if word.startswith("("):
        return "sum"
    return "value" if bare.isdigit() else bare


def completions(config, role: str, items: list[GridItem], prompt_of, sampling) -> list[str]:
    """Each item's text from one role, greedy, through Tandem's own stages: its image encoded with the
    role's tower, then `prompt_of(item, fmt)` decoded with `sampling`."""
    from benchmarks.strategies import InProcess
    from tandem.schemas import GenerationRequest

    runner, fmt = InProcess(config), getattr(config, role).reasoning_format

    async def one(item):
        feats = await runner.stages.encode([item.image], role)
        return (await getattr(runner.stages, role)(GenerationRequest(prompt_of(item, fmt), feats, sampling))).text

    return [asyncio.run(one(item)) for item in items]


def traces(config, role: str, items: list[GridItem]) -> list[str]:
    from tandem import prompts
    from tandem.schemas import SamplingParams

    stop = (prompts.reasoning_stop(getattr(config, role).reasoning_format),)
    sampling = SamplingParams(max_tokens=config.limits.reasoning_max_tokens, stop=stop)
    texts = completions(config, role, items, lambda item, fmt: prompts.reasoning_prompt(item.prompt(), 1, fmt), sampling)
    return [text.strip() for text in texts]


def answers(runner, role: str, items: list[GridItem], reasoning: bool) -> list[str]:
    """Each item's final answer from one role (`runner`: an InProcess over the config): direct — the
    direct prompt, as `mutual`'s first stage sends it — or after the role's own reasoning (its
    reasoning policy through the pipeline)."""
    from tandem.pipeline import Pipeline
    from tandem.schemas import AskRequest

    if reasoning:
        pipeline, policy = Pipeline(runner.config, runner.stages), "large_reasoning" if role == "large" else "small"
        return [asyncio.run(pipeline.answer(AskRequest(question=item.prompt(), images=[item.image], policy=policy,
                                                       request_id=f"t{i}"))).answer.strip()
                for i, item in enumerate(items)]
    return [asyncio.run(runner.direct(role, item)).text.strip() for item in items]


def answer_word(item: GridItem, text: str) -> str:
    """An answer as an option's text: an option letter read as its option."""
    word = text.strip().rstrip(".")
    return item.options[LETTERS.index(word)] if word in LETTERS[: len(item.options)] else word


def offsets(items: list[GridItem], texts: list[str]) -> dict[str, int]:
    """answer − true count per item, counted, nearest first ("other": neither a number nor an option
    letter)."""
    out: dict[str, int] = {}
    for item, text in zip(items, texts):
        word = answer_word(item, text)
        truth = int(item.options[LETTERS.index(item.answer)])
        key = str(int(word) - truth) if word.isdigit() else "other"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (kv[0] == "other", abs(int(kv[0])) if kv[0] != "other" else 0,
                                                    kv[0])))


def options_rule(item: GridItem) -> str:
    """The option nearest the mean of the options (the lower on a tie): an answer read off the options
    alone. With the count at the middle of its option pool it was the count on 61 % of count items,
    and a model trained on such options learns it (docs/training.md)."""
    values = sorted(int(o) for o in item.options)
    mean = sum(values) / len(values)
    return str(min(values, key=lambda v: abs(v - mean)))


def rule_share(items: list[GridItem], texts: list[str]) -> dict[str, int]:
    """How often the options' rule is right, how often the answers are the rule's, and how often they
    are right where the rule is wrong: the part of a direct count the options do not give away."""
    truths = [item.options[LETTERS.index(item.answer)] for item in items]
    words = [answer_word(item, text) for item, text in zip(items, texts)]
    rules = [options_rule(it) for it in items]
    return {"rule_right": sum(r == t for r, t in zip(rules, truths)),
            "answer_is_rule": sum(w == r for w, r in zip(words, rules)),
            "right_where_rule_wrong": sum(w == t for w, t, r in zip(words, truths, rules) if r != t),
            "rule_wrong": sum(r != t for r, t in zip(rules, truths))}


def census_counts(gold: str, text: str) -> tuple[int, int, int]:
    """(colours, counted right, one off) of a census answer against the program's, white left out (the
    empty cells): each colour's count, read off by name."""
    def parse(census: str) -> dict[str, str]:
        pairs = [part.split() for part in census.strip().rstrip(".").split(", ")]
        return {p[0]: p[1] for p in pairs if len(p) == 2}

    want, got = parse(gold), parse(text)
    colours = [c for c in want if c in PALETTE and c != "white"]
    right = sum(got.get(c) == want[c] for c in colours)
    near = sum(got.get(c, "").isdigit() and abs(int(got[c]) - int(want[c])) == 1 for c in colours)
    return len(colours), right, near


def censuses(config, items: list[GridItem]) -> list[str]:
    """Each image's census from the large model: the census question (`training.train`'s) in the
    direct prompt, greedy, through Tandem's own stages."""
    from training.examples import CENSUS_QUESTIONS
    from tandem import prompts
    from tandem.schemas import SamplingParams

    return completions(config, "large", items, lambda _, fmt: prompts.direct_prompt(CENSUS_QUESTIONS[0], 1, fmt),
                       SamplingParams(max_tokens=40))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["small", "large"], default="small")
    ap.add_argument("--tier", choices=TIERS, default="compose")
    ap.add_argument("--n", type=int, default=60, help="held-out items of the tier")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", help="YAML with Tandem args or a serve config; default: the trained pair")
    ap.add_argument("--show", type=int, default=3, help="print this many wrong traces beside the program's")
    ap.add_argument("--direct", action="store_true",
                    help="count items: how far the direct answers (and the reasoning ones) land from the count")
    ap.add_argument("--census", action="store_true",
                    help="the large model's census of each image (every colour's count at once): how many right")
    args = ap.parse_args(argv)
    if args.direct and args.tier != "count":
        ap.error("--direct compares counts: use it with --tier count")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tandem.cli import read_tandem_args
    from tandem.config import load_tandem_config

    config = load_tandem_config(read_tandem_args(args.config))
    if args.census:
        from training.examples import census

        items = grid_items(args.n, seed=args.seed)
        found = [census_counts(census(it.cells), text) for it, text in zip(items, censuses(config, items))]
        colours, right, near = (sum(f[k] for f in found) for k in range(3))
        print(f"large census of {len(items)} held-out images: {right} of {colours} colour counts right, {near} one off")
        print(json.dumps({"benchmark": "census", "n": len(items), "colours": colours, "right": right, "one_off": near}))
        return 0
    pool = grid_items(args.n * 8, seed=args.seed)
    items = [it for it in pool if it.tier == args.tier][: args.n]
    if args.direct:
        from benchmarks.strategies import InProcess

        runner = InProcess(config)
        texts = {kind: answers(runner, args.role, items, reasoning=kind == "reasoning") for kind in ("direct", "reasoning")}
        found = {kind: offsets(items, t) for kind, t in texts.items()}
        for kind, offs in found.items():
            print(f"{args.role} {kind} on {len(items)} held-out count items: answer − count "
                  + ", ".join(f"{k}: {v}" for k, v in offs.items()))
        rule = rule_share(items, texts["direct"])
        print(f"the option nearest the options' mean is the count on {rule['rule_right']}; the direct answer is "
              f"that option on {rule['answer_is_rule']}, and right on {rule['right_where_rule_wrong']} of the "
              f"{rule['rule_wrong']} where it is not")
        print(json.dumps({"benchmark": "count_offsets", "role": args.role, "n": len(items), **found,
                          "options_rule": rule}))
        return 0
    counts: dict[str, int] = {}
    exact, shown = 0, 0
    for item, text in zip(items, traces(config, args.role, items)):
        step = first_wrong(item.trace, text)
        if step is None:
            exact += 1
            continue
        counts[step] = counts.get(step, 0) + 1
        if shown < args.show:
            print(f"program: {item.trace}\nmodel:   {text}\n")
            shown += 1
    model = getattr(config, args.role).model
    print(f"{args.role} on {len(items)} held-out {args.tier} items ({model}): {exact} traces right to the end; "
          "first wrong step: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))
    print(json.dumps({"benchmark": "trace_errors", "role": args.role, "tier": args.tier, "n": len(items),
                      "exact": exact, "first_wrong": counts}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
