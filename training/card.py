"""The model card (README.md beside the weights): the recipe that trained a checkpoint, its command,
its training facts and, given a strategies.json, its accuracy table."""

from __future__ import annotations

import json
from pathlib import Path
from training.schedule import DEFAULTS, FINISH_MIX, MIX


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
    parts = [f"python -m training.train --role {role} --threads {stage['threads']}"]
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
    stages = stage_chain(facts)
    card = _card_head(facts) + _card_data(stages) + _card_training(facts["role"], stages)
    if results:
        card += _card_accuracy(facts["role"], results)
    (folder / "README.md").write_text("\n".join(card))


def _card_head(facts: dict) -> list[str]:
    role, text, vision = facts["role"], facts["sizes"]["text"], facts["sizes"]["vision"]
    return [f"# Tandem trained tiny Qwen3-VL: {ROLE_TITLES[role]}", "",
            "`Qwen3VLForConditionalGeneration` (the real architecture), trained from scratch on CPU on Tandem's "
            "synthetic grid task so that the paper's findings can be measured offline. Load it with "
            f"`from_pretrained` like any checkpoint, or name it `trained:{role}` in a Tandem config.", "",
            "## Architecture", "",
            f"- {facts['parameters']:,} parameters; text: hidden {text['hidden_size']}, {text['num_hidden_layers']} layers, "
            f"{text['num_attention_heads']} heads ({text['num_key_value_heads']} KV), head_dim {text['head_dim']}, "
            f"MLP {text['intermediate_size']}; vision: {vision['depth']} layers x {vision['hidden_size']}, "
            f"DeepStack taps {vision['deepstack_visual_indexes']}; patch 16, merge 2.",
            "- Tokenizer: byte-level BPE (1,024 tokens) trained on the task's text (the same recipe for both "
            "models); Qwen's special tokens and ChatML template.", ""]


def _card_data(stages: list[dict]) -> list[str]:
    first, *later = stages
    card = ["## Task and data", "",
            "`tasks/grid.py`: 4 x 4 grids of flat colours (6 colours + white), 32 px cells = one visual "
            "token per cell; multiple choice A-D answered with the option's text; tiers perceive 50 % "
            "(colour of a cell, is there a colour), count 25 %, compose 25 % (sum of a row of per-colour "
            "values, modulo 10). Programmatic reasoning traces.",
            f"- {first['examples']:,} training examples ({first['steps']} steps x batch {first['batch_size']}), "
            f"one fresh item each (training item seeds < 2^40; held-out items start at 2^40).",
            *phase_lines(first)[:1],
            f"- Curriculum{' (phase 1)' if first.get('phases') else ''}: the first {first['read_first']:.0%} of the "
            "steps are captions only; then one objective "
            f"per batch (the objectives: docs/training.md), drawn from the mix: {mix_text(first['mix'])}"
            + (f"; the last {first['finish_share']:.0%} from the finishing mix: {mix_text(first['finish_mix'])}"
               if first.get("finish_mix") else "")
            + (f"; {first['corrupt_hint_p']:.0%} of transfer hints misread one cell (target: the true answer)."
               if first.get("corrupt_hint_p") else ".")]
    card += phase_lines(first)[1:]
    for n, stage in enumerate(later, 2):
        card.append(f"- Stage {n}, trained on from stage {n - 1}'s checkpoint: {stage['steps']} steps x batch "
                    f"{stage['batch_size']} ({stage['examples']:,} examples), peak LR {stage['lr']}, mix: "
                    f"{mix_text(stage['mix'])}" + tiers_text(stage) + ".")
    card.append(f"- Reasoning format: `{first['reasoning_format']}`. Prompts: `tandem/prompts.py`, fingerprint "
                f"`{first['prompt_fingerprint']}` (a test fails when the templates change: retrain then).")
    return card + [""]


def _card_training(role: str, stages: list[dict]) -> list[str]:
    first, *later = stages
    minutes = sum(s["train_seconds"] for s in stages) / 60
    return ["## Training", "",
            f"AdamW (betas 0.9/0.98, weight decay 0.01), peak LR {first['lr']}, 5 % warm-up then cosine to 10 %, "
            f"gradient clip 1.0, {'bf16 autocast' if first['bf16_autocast'] else 'fp32'}, seed {first['seed']}; "
            f"per-sequence mean cross-entropy on the answer side only; vision position table started as a 2D "
            f"sin-cos grid. {first['train_seconds'] / 60:.1f} min with {first['threads']} torch thread(s)"
            + (f" in each of {first['procs']} data-parallel processes (each on its share of every batch's rows, "
               f"the gradients averaged)" if first.get("procs", 1) > 1 else "")
            + f"{' (batches made in a second process)' if first.get('data_workers') else ''} on the "
            f"2-core development machine{' (' + first['note'] + ')' if first.get('note') else ''}; loss "
            f"{first['loss_first']} (first 50 steps) -> {first['loss_last']} (last 50)."
            + (" Each later stage: " + "; ".join(f"stage {n} {s['train_seconds'] / 60:.1f} min, loss "
                                                  f"{s['loss_first']} -> {s['loss_last']}" for n, s in enumerate(later, 2))
               + f"; {minutes:.1f} min in all." if later else ""), "",
            f"Reproduce: `{stage_command(role, first, False)}`"
            + "".join(f"; then stage {n}, with BASE the stage before: `{stage_command(role, s, True)}`"
                      for n, s in enumerate(later, 2)), ""]


def _card_accuracy(role: str, results: dict) -> list[str]:
    card = ["## Accuracy (held-out grid items, through Tandem's own pipeline)", "",
            f"`python -m benchmarks.strategies --dataset grid --n {results['n']}` "
            "(the trained pair in both roles; one CPU machine, 2 cores):", "",
            accuracy_table(results), ""]
    if results.get("findings"):
        card += ["Findings (their bars: docs/results.md):", ""]
        card += [f"- {k}: {'met' if v['met'] else 'NOT met'} — "
                 + ", ".join(f"{n} {x}" for n, x in v.items() if n != "met") for k, v in results["findings"].items()]
        card.append("")
    if role == "large" and results.get("corrupted_hints"):
        h = results["corrupted_hints"]["all"]
        card += [f"Given a hint that misreads one cell (and so points at a wrong option), this model followed it "
                 f"on {h['followed_corrupted']:.1%} of {h['n']} held-out items and kept the true answer on "
                 f"{h['kept_true_answer']:.1%} (with a clean hint: {h['accuracy_with_clean_hint']:.1%} right).", ""]
    return card
