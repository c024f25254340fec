"""Trains the tiny Qwen3-VL pair on the grid task and writes the checkpoints Tandem ships.

    python -m training.train --role small --threads 1 --procs 2 \
        --schedule training/recipes/small.json            # the shipped small model (~11 min, both cores)
    python -m training.train --role large --threads 1 --procs 2 --batch-size 32 \
        --schedule training/recipes/large.json            # the shipped large model (~14 min, both cores)
    python -m training.train --role small --steps 20 --out /tmp/t   # a smoke run
    python -m training.train --card results/strategies-*/strategies.json   # model cards with accuracy

On the CPU, with a plain torch loop (AdamW, warm-up then cosine), seeded: the same command on the same
CPU gives the same weights. A recipe chains phases in one run, each with its own steps, peak LR,
objective mix and auxiliary losses, and a fresh AdamW. `--procs 2` trains data-parallel on both
cores. docs/training.md says what each objective and auxiliary loss is for and what was measured.
This script owns training only; accuracy comes from `python -m benchmarks.strategies --dataset grid`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from tasks.grid import TIERS
from tandem.checkpoints import TRAINED_DIR
from training.card import write_card
from training.examples import build_task_tokenizer
from training.loop import train
from training.schedule import DEFAULTS, FINISH_SHARE, OBJECTIVES, load_schedule


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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["small", "large", "both"], default="both")
    ap.add_argument("--out", default=str(TRAINED_DIR), help="folder of the role folders (default: the shipped pair)")
    ap.add_argument("--steps", type=int, help="default: per role (small 3000, large 4000)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1, as the shipped pair: another count rounds floats otherwise "
                         "and gives other weights)")
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
                         "tiers (training/recipes/); replaces --steps, --lr, --mix and the tier flags")
    ap.add_argument("--card", metavar="STRATEGIES_JSON",
                    help="only (re)write the model cards, with the accuracy table of this strategies.json")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
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
