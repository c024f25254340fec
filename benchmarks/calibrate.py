"""Calibrates the `confidence` policy's threshold to a target transfer rate, RouteLLM-style.

    python -m benchmarks.calibrate --target-transfer-rate 0.2 --dataset grid --n 400 --out overlay.yaml
    python -m benchmarks.calibrate --target-transfer-rate 0.2 --dataset items.jsonl --url http://127.0.0.1:8000
    python -m benchmarks.calibrate ... --check-seed 1      # the chosen threshold on other held-out items

On each item it asks `tandem:confidence@0` (the large model answers directly and reports its
confidence; a threshold of 0 never transfers) and `tandem:always` (the answer a transfer gives),
in-process (the trained pair by default, or `--config`) or through a running server's API (`--url`).
It picks the threshold under which exactly the target share of the items' confidences fall (the
midpoint between two neighbouring confidences), reports the accuracy the policy reaches there and a
table of rates vs accuracy, and writes the threshold as a serve-config overlay (`--base` merges it
into a whole config). `--check-seed` measures the transfer rate the threshold gives on a second,
disjoint set of held-out grid items. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import yaml

from benchmarks.client import Asker, add_asker_args
from tasks.datasets import Item
from benchmarks.strategies import is_correct, load_items

RATES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)


def confidences(ask: Asker, items: list[Item]) -> list[tuple[float, bool]]:
    """(the large model's confidence, whether its direct answer is right) per item."""
    out = []
    for item in items:
        answer, trace = ask(item, "confidence@0")
        out.append((trace["decision"]["confidence"], is_correct(answer, item)))
    return out


def choose_threshold(values: list[float], rate: float) -> float:
    """The threshold under which `rate` of `values` fall (`confidence < threshold` transfers):
    midway between the k-th and (k+1)-th smallest, k = round(rate x n)."""
    ordered = sorted(values)
    k = round(rate * len(ordered))
    if k <= 0:
        return 0.0
    if k >= len(ordered):
        return min(1.0, ordered[-1] + 1e-6) if ordered[-1] < 1.0 else 1.0
    return (ordered[k - 1] + ordered[k]) / 2


def transfer_rate(values: list[float], threshold: float) -> float:
    return sum(v < threshold for v in values) / len(values)


def accuracy_at(threshold: float, conf: list[tuple[float, bool]], transfer_right: list[bool]) -> float:
    """The policy's accuracy: the transfer's answer under the threshold, the large model's above."""
    return sum(t if c < threshold else right for (c, right), t in zip(conf, transfer_right)) / len(conf)


def overlay(threshold: float, base: dict | None) -> dict:
    if base is None:
        return {"applications": [{"name": "tandem", "args": {"policy": {"confidence_threshold": threshold}}}]}
    config = copy.deepcopy(base)
    args = config["applications"][0].setdefault("args", {})
    args.setdefault("policy", {})["confidence_threshold"] = threshold
    return config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", choices=["confidence"], default="confidence",
                    help="the policy whose threshold is calibrated (random's parameter is its rate already)")
    ap.add_argument("--target-transfer-rate", type=float, required=True)
    add_asker_args(ap, n=400)
    ap.add_argument("--check-seed", type=int, help="grid: measure the threshold's rate on these other held-out items")
    ap.add_argument("--out", help="write the threshold as a serve-config overlay (YAML)")
    ap.add_argument("--base", help="with --out: a serve config to merge the threshold into (a whole config)")
    args = ap.parse_args(argv)
    if not 0 <= args.target_transfer_rate <= 1:
        ap.error("--target-transfer-rate must be from 0 to 1")

    items = load_items(args)
    ask = Asker(args.url, args.api_key, args.config)
    print(f"calibrating {args.policy} on {len(items)} items of {args.dataset}, {ask.where}")
    conf = confidences(ask, items)
    transfer_right = [is_correct(ask(item, "always")[0], item) for item in items]
    values = [c for c, _ in conf]
    threshold = choose_threshold(values, args.target_transfer_rate)

    table = []
    for rate in sorted({*RATES, args.target_transfer_rate}):
        t = choose_threshold(values, rate)
        table.append({"target": rate, "threshold": round(t, 6), "transfer_rate": transfer_rate(values, t),
                      "accuracy": accuracy_at(t, conf, transfer_right)})
    print(f"{'target':>7} {'threshold':>10} {'rate':>6} {'accuracy':>9}")
    for r in table:
        mark = "  <- chosen" if r["target"] == args.target_transfer_rate else ""
        print(f"{r['target']:>7.2f} {r['threshold']:>10.4f} {r['transfer_rate']:>6.1%} {r['accuracy']:>9.1%}{mark}")

    result = {"benchmark": "calibrate", "policy": args.policy, "n": len(items), "target": args.target_transfer_rate,
              "threshold": round(threshold, 6), "transfer_rate": transfer_rate(values, threshold),
              "accuracy": accuracy_at(threshold, conf, transfer_right),
              "accuracy_large": sum(r for _, r in conf) / len(conf),
              "accuracy_always": sum(transfer_right) / len(transfer_right), "table": table}
    if args.check_seed is not None:
        check = load_items(argparse.Namespace(**{**vars(args), "seed": args.check_seed}))
        check_values = [c for c, _ in confidences(ask, check)]
        result["check"] = {"seed": args.check_seed, "n": len(check),
                           "transfer_rate": transfer_rate(check_values, threshold)}
        print(f"check on {len(check)} other items (seed {args.check_seed}): transfer rate "
              f"{result['check']['transfer_rate']:.1%} at threshold {threshold:.4f} (target {args.target_transfer_rate:.0%})")
    if args.out:
        base = yaml.safe_load(Path(args.base).read_text()) if args.base else None
        Path(args.out).write_text(f"# python -m benchmarks.calibrate --target-transfer-rate {args.target_transfer_rate} "
                                  f"--dataset {args.dataset} --n {len(items)}: transfer rate "
                                  f"{result['transfer_rate']:.1%}, accuracy {result['accuracy']:.1%}\n"
                                  + yaml.safe_dump(overlay(round(threshold, 6), base), sort_keys=False))
        print(f"serve config {'(whole)' if base else 'overlay'}: {args.out}")
    print(f"threshold {threshold:.4f}: per request, model tandem:{args.policy}@{threshold:.4f}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
