"""What prefix KV reuse saves a `mutual` request, in-process, on the trained pair: the held-out grid
items that transfer, each run with reuse off and on in alternating blocks (the same load for both).

    python -m benchmarks.prefix_reuse --n 200          # ~1 min on 2 CPU cores
    python -m benchmarks.prefix_reuse --quick          # 40 items

Reported, per setting, for the transfer stage: its prompt tokens, the tokens the large model actually
prefills for it (counted where the decoder is called, not derived) and those served from the kept
head; its time, its prefill's time (timed around the engine's prefill) and the small model's
reasoning TTFT (p50); and whether every item's answer is the
same with reuse on and off. Prints a table, ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from benchmarks.metrics import percentile

BLOCK = 10  # items per alternating block


def counting(engine, prefills: dict) -> None:
    """Record, per engine, the tokens each prefill runs the decoder over (counted where the decoder
    is called, padding included; decode steps are not prefills) and each prefill's time (ms, under
    `<name>_ms`)."""
    real_decode, real_prefill, inside = engine._decode, engine.prefill, [False]

    def decode(ids, *args, **kwargs):
        if inside[0]:
            prefills.setdefault(engine.name, []).append(int(ids.shape[0] * ids.shape[1]))
        return real_decode(ids, *args, **kwargs)

    def prefill(*args, **kwargs):
        inside[0], start = True, time.perf_counter()
        try:
            return real_prefill(*args, **kwargs)
        finally:
            inside[0] = False
            prefills.setdefault(f"{engine.name}_ms", []).append((time.perf_counter() - start) * 1000)
    engine._decode, engine.prefill = decode, prefill


def run_item(tandem, item, index: int, reuse: bool, counts: dict) -> dict:
    from tandem.schemas import AskRequest

    for engine in tandem.engines.values():
        engine.configure(8, 0.0, prefix_cache_bytes=256 * 2**20 if reuse else 0)
    before = len(counts.get("large", []))
    r = tandem.ask(AskRequest(item.prompt(), [item.image], policy="mutual", request_id=f"{reuse}-{index}"))
    stage = r.stages.get("large_transfer", {})
    return {"answer": r.answer, "path": r.path, "cached": stage.get("cached_tokens", 0),
            "transfer_prefilled": counts.get("large", [])[-1] if len(counts.get("large", [])) > before else None,
            "transfer_suffix": stage.get("prompt_tokens", 0) - stage.get("cached_tokens", 0),
            "transfer_ms": r.latency_ms.get("large_transfer"),
            "transfer_prefill_ms": counts["large_ms"][-1] if len(counts.get("large", [])) > before else None,
            "reasoning_ttft_ms": r.stages.get("small_reasoning", {}).get("ttft_ms"),
            "transfer_prompt": stage.get("prompt_tokens")}


def measure(items, tandem) -> dict[bool, list[dict]]:
    counts: dict = {}
    for engine in tandem.engines.values():
        counting(engine, counts)
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for start in range(0, len(items), BLOCK):
        block = items[start:start + BLOCK]
        order = (False, True) if (start // BLOCK) % 2 == 0 else (True, False)
        for reuse in order:
            runs[reuse] += [run_item(tandem, it, start + i, reuse, counts) for i, it in enumerate(block)]
    return runs


def summary(runs: list[dict]) -> dict:
    transfers = [r for r in runs if r["path"] == "transfer"]
    return {"transfers": len(transfers),
            "transfer_prompt_tokens": round(statistics.mean(r["transfer_prompt"] for r in transfers), 1)
            if transfers else None,
            "transfer_prefilled_tokens": round(statistics.mean(r["transfer_prefilled"] for r in transfers), 1)
            if transfers else None,
            "prefilled_over_suffix_max": max(r["transfer_prefilled"] - r["transfer_suffix"] for r in transfers)
            if transfers else None,
            "cached_tokens_per_transfer": round(statistics.mean(r["cached"] for r in transfers), 1) if transfers else None,
            "transfer_p50_ms": round(percentile([r["transfer_ms"] for r in transfers], 50), 2) if transfers else None,
            "transfer_prefill_p50_ms": round(percentile([r["transfer_prefill_ms"] for r in transfers], 50), 2)
            if transfers else None,
            "reasoning_ttft_p50_ms": round(percentile([r["reasoning_ttft_ms"] for r in transfers], 50), 2)
            if transfers else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="held-out grid items")
    ap.add_argument("--quick", action="store_true", help="40 items")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from tandem.config import load_tandem_config
    from tandem.local import LocalTandem
    from tasks.grid import grid_items

    torch.set_num_threads(1)
    n = 40 if args.quick else args.n
    print(f"prefix_reuse: {n} held-out grid items, trained pair, policy mutual, in-process; "
          f"{platform.machine()} {os.cpu_count()} cores, torch threads 1; reuse off/on in blocks of {BLOCK}")
    with LocalTandem(load_tandem_config({})) as tandem:
        runs = measure(grid_items(n, seed=0, split="eval"), tandem)
    same = [a["answer"] for a in runs[False]] == [b["answer"] for b in runs[True]]
    rows = {"off": summary(runs[False]), "on": summary(runs[True])}
    print(f"{'reuse':6} {'transfers':>9} {'prompt':>7} {'prefilled':>9} {'cached':>7} {'transfer p50 ms':>16} "
          f"{'its prefill p50 ms':>19} {'reasoning TTFT p50 ms':>22}")
    for name, s in rows.items():
        print(f"{name:6} {s['transfers']:>9} {s['transfer_prompt_tokens']!s:>7} {s['transfer_prefilled_tokens']!s:>9} "
              f"{s['cached_tokens_per_transfer']!s:>7} {s['transfer_p50_ms']!s:>16} {s['transfer_prefill_p50_ms']!s:>19} "
              f"{s['reasoning_ttft_p50_ms']!s:>22}")
    print(f"every answer the same with reuse on and off: {same}")
    print(json.dumps({"benchmark": "prefix_reuse", "n": n, "same_answers": same, **rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
