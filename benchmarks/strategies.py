"""Each policy (and selector) on a visual-question dataset: accuracy against latency.

    python -m benchmarks.strategies --dataset grid --n 400         # the trained pair on held-out grid items
    python -m benchmarks.strategies --quick                       # 12 items, under two minutes
    python -m benchmarks.strategies --url http://host:8000 --dataset mmbench.tsv

Runs every policy over the items, through the HTTP API (`--url`) or in-process (default; the same
core pipeline with engines called directly), plus `small_direct`: the small model answering at once,
as in `mutual`'s first stage. Reports accuracy with its 95 % interval and per tier (when the dataset
has tiers), mean/p50/p95 latency, output tokens per stage, transfer rate, and how `mutual` routed
each tier (answered on agreement vs by transfer). In-process it also measures how often the large
model follows a corrupted hint (grid: the trace with one cell misread), compares the selectors
(full, budget, attention) at equal budgets under `always`, and runs speculative decoding as the peer
a user would pick instead of `large_reasoning`: the large model reasoning with the small one
drafting (transformers' assisted generation; exact under greedy). In-process the rows are
interleaved — each item goes through every row in turn — so the latencies the findings compare are
taken under the same machine load.
Table, accuracy-vs-latency PNG, JSON, and one JSON line at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

from benchmarks.client import ROOT
from tasks.datasets import LETTERS, Item, load_jsonl, load_mmbench_tsv, synthetic
from benchmarks.metrics import percentile, wilson_interval
from tandem.agreement import normalize_answer
from tandem.config import POLICY_NAMES, TandemConfig, load_tandem_config

SELECTORS = ("full", "budget", "attention")
GRID_TIERS = ("perceive", "count", "compose")


def is_correct(answer: str, item: Item) -> bool:
    """The option's letter, or its text, counts."""
    norm = normalize_answer(answer)
    right = item.options[LETTERS.index(item.answer)]
    return norm == f"opt:{item.answer}" or (bool(norm) and norm == normalize_answer(right))


def record(item: Item, answer: str, latency_ms: float, tokens: dict, path: str, transferred: int) -> dict:
    return {"correct": is_correct(answer, item), "latency_ms": latency_ms, "tokens": tokens, "path": path,
            "transferred": transferred, "tier": item.tier}


def by_tier(runs: list[dict]) -> dict[str, list[dict]]:
    tiers: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        if r["tier"]:
            tiers[r["tier"]].append(r)
    return dict(tiers)


def accuracy(runs: list[dict]) -> float | None:
    """Share answered right; None (JSON null) when there is nothing to count."""
    return round(sum(r["correct"] for r in runs) / len(runs), 3) if runs else None


def row(name: str, runs: list[dict]) -> dict:
    lat = [r["latency_ms"] for r in runs]
    tokens: dict[str, list[int]] = defaultdict(list)
    for r in runs:
        for stage, n in r["tokens"].items():
            tokens[stage].append(n)
    paths = Counter(r["path"] for r in runs)
    low, high = wilson_interval(sum(r["correct"] for r in runs), len(runs))
    return {"name": name, "n": len(runs), "accuracy": accuracy(runs), "accuracy_ci95": [round(low, 3), round(high, 3)],
            "accuracy_by_tier": {t: accuracy(rs) for t, rs in sorted(by_tier(runs).items())},
            "mean_ms": round(sum(lat) / len(lat), 1), "p50_ms": round(percentile(lat, 50), 1),
            "p95_ms": round(percentile(lat, 95), 1),
            "output_tokens": round(sum(sum(r["tokens"].values()) for r in runs) / len(runs), 1),
            "tokens_per_stage": {k: round(sum(v) / len(runs), 1) for k, v in sorted(tokens.items())},
            "transfer_rate": round(paths.get("transfer", 0) / len(runs), 3),
            "transferred_tokens": round(sum(r["transferred"] for r in runs) / len(runs), 1),
            "paths": {k: round(v / len(runs), 3) for k, v in sorted(paths.items())}}


def routing(runs: list[dict]) -> dict:
    """How `mutual` answered each tier: on agreement or by transfer, with the accuracy of each path
    (the paper's MMBench split: most questions never needed a transfer)."""
    out = {}
    for tier, rs in sorted({"all": runs, **by_tier(runs)}.items()):
        out[tier] = {path: {"n": len(p), "accuracy": accuracy(p)}
                     for path in ("agree", "transfer") for p in [[r for r in rs if r["path"] == path]]}
    return out


class InProcess:
    """The core pipeline over engines loaded once; a pipeline per selector variant shares them."""

    def __init__(self, config: TandemConfig):
        from tandem.local import load_engines, local_stages

        self.config, self.engines = config, load_engines(config)
        self.stages = local_stages(self.engines)
        self.compare_budget = config.selector.budget_tokens

    def row(self, policy: str, selector: str | None = None) -> Callable[[Item, int], dict]:
        """One row: a function answering item i with `policy` (and `selector`) through the pipeline."""
        from tandem.local import local_stages
        from tandem.pipeline import Pipeline
        from tandem.schemas import AskRequest

        cfg = self.config
        if selector:
            cfg = cfg.model_copy(update={"selector": cfg.selector.model_copy(
                update={"kind": selector, "budget_tokens": self.compare_budget})})
        pipeline = Pipeline(cfg, local_stages(self.engines))

        def one(item: Item, i: int) -> dict:
            result = asyncio.run(pipeline.answer(AskRequest(question=item.prompt(), images=[item.image],
                                                            policy=policy, request_id=f"s{i}")))
            return record(item, result.answer, result.latency_ms["total"], result.tokens, result.path,
                          result.transferred_tokens)
        return one

    async def _generate(self, role: str, prompt: str, feats):
        """One short answer from one role, through the same stages the pipeline uses."""
        from tandem.schemas import GenerationRequest, SamplingParams

        sampling = SamplingParams(max_tokens=self.config.limits.answer_max_tokens)
        return await getattr(self.stages, role)(GenerationRequest(prompt, feats, sampling))

    async def direct(self, role: str, item: Item):
        """One role answering at once, as in `mutual`'s first stage: encode with its tower, then the
        direct prompt."""
        from tandem import prompts

        feats = await self.stages.encode([item.image], role)
        fmt = getattr(self.config, role).reasoning_format
        return await self._generate(role, prompts.direct_prompt(item.prompt(), 1, fmt), feats)

    def small_direct(self, item: Item, _i: int = 0) -> dict:
        """The small model answering at once: `mutual`'s first stage on its own."""
        start = time.perf_counter()
        out = asyncio.run(self.direct("small", item))
        return record(item, out.text.strip(), (time.perf_counter() - start) * 1000,
                      {"small_direct": out.completion_tokens}, "small_direct", 0)

    def corrupted_hints(self, items: list[Item]) -> dict:
        """How the large model answers a transfer prompt whose hint misreads one cell (grid items):
        followed the hint, kept the true answer, or neither; per tier. Clean hints for reference."""
        import random

        from tasks.grid import corrupt_trace
        from tandem import prompts

        fmt, rng = self.config.large.reasoning_format, random.Random(0)

        async def answers(item, hints):
            feats = await self.stages.encode([item.image], "large")  # once for both hints
            return [(await self._generate("large", prompts.transfer_prompt(item.prompt(), 1, h, fmt), feats)).text
                    for h in hints]

        counts: dict[str, Counter] = defaultdict(Counter)
        for item in items:
            trace, wrong = corrupt_trace(item, rng)
            if wrong == item.options[LETTERS.index(item.answer)]:
                continue  # no misread changes this answer: nothing to follow
            said, clean = asyncio.run(answers(item, [trace, item.trace]))
            outcome = ("followed" if normalize_answer(said) == normalize_answer(wrong) else
                       "true" if is_correct(said, item) else "other")
            for key in ("all", item.tier):
                counts[key][outcome] += 1
                counts[key]["n"] += 1
                counts[key]["clean_correct"] += is_correct(clean, item)
        return {tier: {"n": c["n"], "followed_corrupted": round(c["followed"] / c["n"], 3),
                       "kept_true_answer": round(c["true"] / c["n"], 3),
                       "accuracy_with_clean_hint": round(c["clean_correct"] / c["n"], 3)}
                for tier, c in sorted(counts.items())}

    def speculative(self, item: Item, _i: int = 0) -> dict:
        """`large_reasoning` as plain speculative decoding: the same two stages (reason, then answer),
        each generated by the large model with the small model drafting, from pixels. The reasoning is
        not stopped at its stop string (see below), so on models that would stop early it costs more
        than `large_reasoning` does."""
        import torch

        from tandem import prompts
        from tandem.images import decode_image

        large, small = self.engines["large"], self.engines["small"]
        fmt, limits = self.config.large.reasoning_format, self.config.limits
        size = {"shortest_edge": self.config.large.min_pixels, "longest_edge": self.config.large.max_pixels}
        start = time.perf_counter()
        image = decode_image(item.image)
        prompt = prompts.reasoning_prompt(item.prompt(), 1, fmt)
        tokens = {}

        def generate(text, max_new, stage, stop=None):
            inputs = large.processor(text=[text], images=[image], images_kwargs={"size": size},
                                     return_tensors="pt").to(large.device)
            # Assisted generation refuses stop strings (its draft model has no tokenizer to match them
            # with), so the reasoning runs to its budget and is cut at the stop afterwards.
            with torch.inference_mode():
                out = large.model.generate(**inputs, max_new_tokens=max_new, do_sample=False,
                                           assistant_model=small.model)
            new = out[0, inputs["input_ids"].shape[1]:]
            tokens[stage] = int(new.numel())
            text_out = large.tokenizer.decode(new, skip_special_tokens=True)
            return text_out.split(stop)[0] if stop else text_out

        reasoning = generate(prompt, limits.reasoning_max_tokens, "large_reasoning", prompts.reasoning_stop(fmt))
        answer = generate(prompts.answer_after_reasoning(prompt, reasoning, fmt), limits.answer_max_tokens,
                          "large_answer")
        return record(item, answer, (time.perf_counter() - start) * 1000, tokens, "speculative", 0)


def http_record(ask, item: Item, policy: str) -> dict:
    """`policy` on one item through a server's API (`ask`: a benchmarks.client.Asker on its URL)."""
    answer, t = ask(item, policy)
    return {**record(item, answer, t["latency_ms"]["total"], t["tokens"], t["path"], t["transferred_tokens"]),
            "trace": t}


def measure(items: list[Item], rows: dict[str, Callable[[Item, int], dict]], interleave: bool = True,
            progress: bool = True) -> dict[str, list[dict]]:
    """Every row on every item. Interleaved (each item through every row in turn, the order rotating
    by one per item), a row's latencies and another's are taken in the same minutes: on a machine
    whose speed drifts, rows run one after another can differ by a fifth for the drift alone, and the
    findings compare two rows' p50s."""
    from tqdm import tqdm

    names = list(rows)
    runs: dict[str, list] = {name: [None] * len(items) for name in names}
    if interleave:
        for i, item in enumerate(tqdm(items, desc="items", disable=not progress or None)):
            k = i % len(names)
            for name in names[k:] + names[:k]:
                runs[name][i] = rows[name](item, i)
    else:
        for name in tqdm(names, desc="rows", disable=not progress or None):
            runs[name] = [rows[name](item, i) for i, item in enumerate(items)]
    return runs


def small_direct_from_mutual(items: list[Item], mutual: list[dict]) -> list[dict]:
    """Over HTTP the small model's direct answer is read off `mutual`'s first stage (its trace holds
    it); the latency is that stage's, run beside the large model's."""
    out = []
    for item, run in zip(items, mutual):
        t = run["trace"]
        out.append(record(item, t["decision"]["small_answer"],
                          t["latency_ms"].get("encode_small", 0) + t["latency_ms"]["small_direct"],
                          {"small_direct": t["tokens"]["small_direct"]}, "small_direct", 0))
    return out


def load_items(args) -> list[Item]:
    if args.dataset == "synthetic":
        return synthetic(args.n, args.seed)
    if args.dataset == "grid":
        from tasks.grid import grid_items
        return grid_items(args.n, args.seed, split="eval")
    if args.dataset.endswith(".tsv"):
        return load_mmbench_tsv(args.dataset)[: args.n]
    return load_jsonl(args.dataset)[: args.n]


HEADER = (f"{'run':<26} {'acc':>6} {'ci95':>11} {'perc':>5} {'count':>5} {'comp':>5} {'mean_ms':>8} {'p50_ms':>8} "
          f"{'p95_ms':>8} {'tokens':>6} {'xfer':>5} {'xtok':>5}  paths | tokens/stage")


def print_row(r: dict) -> None:
    stages = " ".join(f"{k}={v:g}" for k, v in r["tokens_per_stage"].items())
    paths = " ".join(f"{k}={v:.0%}" for k, v in r["paths"].items())
    tiers = " ".join(f"{'-':>5}" if r["accuracy_by_tier"].get(t) is None else f"{r['accuracy_by_tier'][t]:>5.1%}"
                     for t in GRID_TIERS)
    ci = f"{r['accuracy_ci95'][0]:.0%}-{r['accuracy_ci95'][1]:.0%}"
    print(f"{r['name']:<26} {r['accuracy']:>6.1%} {ci:>11} {tiers} {r['mean_ms']:>8.1f} {r['p50_ms']:>8.1f} "
          f"{r['p95_ms']:>8.1f} {r['output_tokens']:>6.1f} {r['transfer_rate']:>5.0%} {r['transferred_tokens']:>5.1f}  "
          f"{paths} | {stages}", flush=True)


def plot(rows: list[dict], path: Path, title: str) -> None:
    from benchmarks.plotting import subplots

    fig, ax = subplots(figsize=(8, 5))
    for r in rows:
        low, high = r["accuracy_ci95"]
        ax.errorbar(r["p50_ms"], r["accuracy"], yerr=[[r["accuracy"] - low], [high - r["accuracy"]]], fmt="o",
                    capsize=3)
        ax.annotate(r["name"], (r["p50_ms"], r["accuracy"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("p50 latency (ms)")
    ax.set_ylabel("accuracy (95 % interval)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)


def findings(runs: dict[str, list[dict]], rows: dict[str, dict]) -> dict:
    """The paper's three findings, each figure with its bar (docs/results.md). Stated on the grid task's
    tiers: a dataset without them (the synthetic one of `--quick`, MMBench) has no findings."""
    need = {"small_direct", "small", "large", "large_reasoning", "mutual", "always"}
    tiers = {r.get("tier") for name in need & set(runs) for r in runs[name]}
    if not need <= set(rows) or not ({"perceive", "count"} & tiers and "compose" in tiers):
        return {}
    acc = lambda name, tiers=None: accuracy([r for r in runs[name] if tiers is None or r["tier"] in tiers])  # noqa: E731
    tokens = {name: rows[name]["output_tokens"] for name in need}
    easy = ("perceive", "count")
    gap = acc("large_reasoning") - acc("large")
    f = {"F1": {"small_minus_small_direct": round(acc("small") - acc("small_direct"), 3),
                "token_ratio": round(tokens["small"] / max(tokens["small_direct"], 1e-9), 1)},
         "F2": {"large_minus_small_direct": round(acc("large") - acc("small_direct"), 3),
                "perceive_count_large_minus_small": round(acc("large", easy) - acc("small", easy), 3),
                "token_ratio_large_to_small": round(tokens["large"] / max(tokens["small"], 1e-9), 3)},
         "F3": {"gap_recovered": round((acc("mutual") - acc("large")) / gap, 3) if gap > 0 else None,
                # The ratio divides by this gap; when it is a few points it is inside the rows' intervals
                # and the ratio is noise, whatever it says.
                "gap_large_reasoning_minus_large": round(gap, 3),
                "gap_inside_large_reasoning_ci95": rows["large_reasoning"]["accuracy_ci95"][0] <= acc("large"),
                "p50_ratio_mutual_to_large_reasoning": round(rows["mutual"]["p50_ms"] / rows["large_reasoning"]["p50_ms"], 3),
                "compose_always_minus_large": round(acc("always", ("compose",)) - acc("large", ("compose",)), 3)}}
    f["F1"]["met"] = f["F1"]["small_minus_small_direct"] >= 0.25 and f["F1"]["token_ratio"] >= 5
    f["F2"]["met"] = (f["F2"]["large_minus_small_direct"] >= 0.10 and f["F2"]["perceive_count_large_minus_small"] >= -0.05
                      and f["F2"]["token_ratio_large_to_small"] <= 0.2)
    f["F3"]["met"] = (gap > 0 and f["F3"]["gap_recovered"] >= 0.7 and f["F3"]["p50_ratio_mutual_to_large_reasoning"] <= 0.6
                      and f["F3"]["compose_always_minus_large"] >= 0.20)
    return f


def parse_policies(text: str | None) -> list[str]:
    names = ["small_direct", *POLICY_NAMES]
    if not text:
        return names
    chosen = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in names]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; known: {', '.join(names)}")
    return chosen


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synthetic",
                    help="grid (held-out items of the trained pair's task), synthetic, a .jsonl file, or an MMBench .tsv")
    ap.add_argument("--n", type=int, default=200, help="items (first n of a file)")
    ap.add_argument("--policies", help="comma-separated rows to run (policies and small_direct); default all, "
                                       "plus the selector comparison, speculative decoding and corrupted hints")
    ap.add_argument("--url", help="run through this endpoint's HTTP API instead of in-process")
    ap.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY"))
    ap.add_argument("--config", help="YAML with Tandem args or a serve config (in-process); default: the trained pair")
    ap.add_argument("--budget", type=int, default=None,
                    help="budget (tokens) of the selector comparison; default a quarter of the reasoning budget")
    ap.add_argument("--quick", action="store_true", help="CPU, 12 items: under two minutes")
    ap.add_argument("--seed", type=int, default=0, help="picks the items (grid: other held-out items)")
    ap.add_argument("--sequential", action="store_true",
                    help="run the rows one after another instead of interleaving them item by item")
    ap.add_argument("--out", default=str(ROOT / "results"))
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.quick:
        args.n = min(args.n, 12)
    from tandem.cli import read_tandem_args

    policies = parse_policies(args.policies)
    extras = not args.policies and not args.url
    items = load_items(args)
    config = load_tandem_config(read_tandem_args(args.config))
    # Selectors are compared at one budget below the reasoning length, or all would keep everything.
    compare_budget = args.budget or max(1, config.limits.reasoning_max_tokens // 4)
    mode = f"HTTP {args.url}" if args.url else f"in-process ({config.small.model} + {config.large.model})"
    selectors = ("the server's selector; no selector comparison over HTTP" if args.url else
                 f"selector {config.selector.kind}@{config.selector.budget_tokens} for the policies" +
                 (f", selectors compared at {compare_budget} tokens" if extras else ""))
    print(f"strategies: {len(items)} items from {args.dataset} (seed {args.seed}); {mode}; {selectors}; "
          f"{platform.machine()} {os.cpu_count()} cores")
    runner = None if args.url else InProcess(config)
    if runner:
        runner.compare_budget = compare_budget
    else:
        from benchmarks.client import Asker
        ask = Asker(args.url, args.api_key, None)
    plan = [(p, None) for p in policies if p != "small_direct" or not args.url]
    plan += [("always", s) for s in SELECTORS] if extras else []
    measured: dict[str, Callable[[Item, int], dict]] = {}
    for policy, selector in plan:
        name = policy + (f"/{selector}@{compare_budget}" if selector else "")
        if args.url:
            measured[name] = lambda item, _i, policy=policy: http_record(ask, item, policy)
        else:
            measured[name] = runner.small_direct if policy == "small_direct" else runner.row(policy, selector)
    if extras:
        measured["speculative(large|small)"] = runner.speculative
    # Over HTTP rows run one after another: the server's feature cache would make whichever row came
    # first on an item the only one that encodes it.
    runs = measure(items, measured, interleave=not (args.url or args.sequential))
    print(HEADER)
    for name, rs in runs.items():
        print_row(row(name, rs))
    if args.url and "small_direct" in policies and "mutual" in runs:
        runs["small_direct"] = small_direct_from_mutual(items, runs["mutual"])
        print_row(row("small_direct", runs["small_direct"]))
    report = write_report(args, items, runs, runner if extras else None)
    print(json.dumps(report))
    return 0


def write_report(args, items: list[Item], runs: dict[str, list[dict]], extras_runner) -> dict:
    """The report's figures (routing, corrupted hints, findings), printed and written with the plot
    under `--out`; returns the report for the last JSON line."""
    rows = {name: row(name, rs) for name, rs in runs.items()}
    report = {"benchmark": "strategies", "dataset": args.dataset, "n": len(items),
              "rows": {name: {k: r[k] for k in ("accuracy", "accuracy_by_tier", "p50_ms", "output_tokens",
                                                "transfer_rate")} for name, r in rows.items()}}
    if "mutual" in runs:
        report["mutual_routing"] = routing(runs["mutual"])
        print("mutual routing (answered on agreement vs by transfer):",
              json.dumps(report["mutual_routing"]))
    if extras_runner is not None and args.dataset == "grid":
        report["corrupted_hints"] = extras_runner.corrupted_hints(items)
        print("large model given a hint that misreads a cell:", json.dumps(report["corrupted_hints"]))
    if found := findings(runs, rows):
        report["findings"] = found
        for key, figures in report["findings"].items():
            print(f"{key}: {'met' if figures['met'] else 'NOT met'}  {figures}")
    out = Path(args.out) / f"strategies-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "strategies.json").write_text(json.dumps({**report, "rows": list(rows.values())}, indent=1))
    plot(list(rows.values()), out / "strategies.png",
         f"{args.dataset}, {len(items)} items: accuracy vs p50 latency, one point per row")
    print(f"results: {out}")
    return report


if __name__ == "__main__":
    raise SystemExit(main())
