"""Latency budgets per request: how often a request answers within its budget, with and without it.

    python -m benchmarks.budget --n 300                       # in-process, the trained pair
    python -m benchmarks.budget --url http://127.0.0.1:8000 --n 300

One run, one request at a time (the machine under no other load): `always` without a budget on the
held-out grid items gives the p50 P; then the same items with `tandem.latency_budget_ms` of 0.5 P,
1 P and 2 P. Per budget: the share of requests answered within it with the budget vs the share of
the unbudgeted run that was, what the router did (full / shortened reasoning / answered directly),
predicted vs actual latency, and accuracy. `large` (the direct path) runs too: a budget under its
p95 is one no path can meet. Latency is the router's own (the trace's total; over HTTP the
client's round trip adds to it). Warm-up requests teach the router's estimates first. Last line:
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics

from benchmarks.client import Asker, add_asker_args
from benchmarks.metrics import percentile
from benchmarks.strategies import is_correct, load_items


def run(ask: Asker, items, model: str, **options) -> list[dict]:
    out = []
    for item in items:
        answer, trace = ask(item, model, **options)
        out.append({"ms": trace["latency_ms"]["total"], "correct": is_correct(answer, item), "path": trace["path"],
                    "budget": trace.get("budget"), "reasoning": trace["tokens"].get("small_reasoning", 0)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_asker_args(ap, n=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--factors", default="0.5,1,2", help="budgets as multiples of always's p50")
    args = ap.parse_args(argv)

    items = load_items(args)
    ask = Asker(args.url, args.api_key, args.config)
    print(f"latency budgets on {len(items)} items of {args.dataset}, {ask.where}, one request at a time")
    run(ask, items[: args.warmup], "always")
    run(ask, items[: args.warmup], "large")
    free, direct = run(ask, items, "always"), run(ask, items, "large")
    p50 = statistics.median(r["ms"] for r in free)
    direct_p95 = percentile([r["ms"] for r in direct], 95)
    rows = {"always": summary(free, None), "large": summary(direct, None)}
    for factor in (float(f) for f in args.factors.split(",")):
        budget = factor * p50
        runs = run(ask, items, "always", latency_budget_ms=budget)
        rows[f"always@{factor:g}xp50"] = {**summary(runs, budget), "budget_ms": round(budget, 2), "factor": factor,
                                          "within_without_budget": within(free, budget),
                                          "meetable": budget >= direct_p95}
    print(f"always p50 {p50:.1f} ms; large (direct) p95 {direct_p95:.1f} ms: a budget under it no path meets")
    print(f"{'run':<18} {'budget':>8} {'within':>7} {'w/o':>7} {'acc':>6} {'p50':>7} {'p95':>7} "
          f"{'full':>5} {'short':>5} {'direct':>6} {'reason':>6} {'pred-act':>8}")
    for name, r in rows.items():
        b = r.get("budget_ms")
        print(f"{name:<18} {b if b else '-':>8} {pct(r.get('within')):>7} {pct(r.get('within_without_budget')):>7} "
              f"{r['accuracy']:>6.1%} {r['p50_ms']:>7.1f} {r['p95_ms']:>7.1f} {r['actions'].get('full', 0):>5} "
              f"{r['actions'].get('shortened', 0):>5} {r['actions'].get('direct', 0):>6} "
              f"{r['reasoning_tokens']:>6.1f} {fmt(r.get('predicted_minus_actual_ms')):>8}")
    print(json.dumps({"benchmark": "budget", "n": len(items), "always_p50_ms": round(p50, 3),
                      "large_p95_ms": round(direct_p95, 3), "rows": rows}))
    return 0


def within(runs: list[dict], budget: float) -> float:
    return sum(r["ms"] <= budget for r in runs) / len(runs)


def summary(runs: list[dict], budget: float | None) -> dict:
    ms = [r["ms"] for r in runs]
    actions: dict[str, int] = {}
    errors = []
    for r in runs:
        if r["budget"]:
            actions[r["budget"]["action"]] = actions.get(r["budget"]["action"], 0) + 1
            if r["budget"]["predicted_ms"] is not None:
                errors.append(r["budget"]["predicted_ms"] - r["budget"]["actual_ms"])
    out = {"accuracy": sum(r["correct"] for r in runs) / len(runs), "p50_ms": statistics.median(ms),
           "p95_ms": percentile(ms, 95), "actions": actions,
           "reasoning_tokens": statistics.mean(r["reasoning"] for r in runs),
           "predicted_minus_actual_ms": statistics.median(errors) if errors else None}
    if budget is not None:
        out["within"] = within(runs, budget)
    return out


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
