"""What a run trains, phase by phase: the roles' default mixes, a recipe file's phases (checked
before the first step), and the learning rate and objective mix at each step."""

from __future__ import annotations

import json
import math
from pathlib import Path
from tasks.grid import TIERS
from training.objectives import TRACE_HEADS, TRACE_KINDS


MIX = {"small": {"direct": 0.3, "reason": 0.6, "caption": 0.1},
       "large": {"direct": 0.2, "reason": 0.4, "transfer": 0.15, "caption": 0.05, "tally": 0.2}}


# The large model's last 10 % of steps: direct-heavy. Its mix learns to count (the tally objective at
# 20 %: its reasoning then beats its direct answers) but not to look a cell up directly; the finish
# adds that without unlearning the counting (with the last 15 or 25 % the count traces fall apart).
FINISH_MIX = {"small": None,
              "large": {"direct": 0.5, "reason": 0.25, "transfer": 0.1, "caption": 0.05, "tally": 0.1}}


# Curriculum (`read_first`): that share of the steps reads grids only (captions), then the role's
# mix. Mixed from the start, the reasoning objectives drowned the reading signal: a small model no
# better than chance at reading cells after 1,500 mixed steps read 71 % of them after 500
# caption-only steps. Steps are sized to 12-15 min per role on one core of this 2-core machine.
# The large model takes twice the optimizer steps at half the batch (the same examples): at 2,000
# steps x 32 it never learned to look a named cell up (direct answers 35 % on held-out items); at
# 4,000 x 16 it did (65 %, perceive 86 %), but not reliably: two of five such runs made it.
DEFAULTS = {"small": dict(steps=3000, lr=3e-3, read_first=0.2, batch_size=32),
            "large": dict(steps=4000, lr=3e-3, read_first=0.25, batch_size=16, finish_share=0.1)}


FINISH_SHARE = 0.2  # default share of the steps a `--finish-mix` takes (at the end of a run)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def mix_at(step: int, steps: int, read_first: float, mix: dict[str, float],
           finish_mix: dict[str, float] | None = None, finish_share: float = FINISH_SHARE) -> dict[str, float]:
    """The objectives' mix of one step: captions only for the first `read_first` of the steps, the
    role's mix, and `finish_mix` for the last `finish_share` of them when given."""
    if step < read_first * steps:
        return {"caption": 1.0}
    if finish_mix and step >= (1 - finish_share) * steps:
        return finish_mix
    return mix


def role_schedule(role: str, mix: dict[str, float] | None = None, finish_mix: dict[str, float] | None = None,
                  finish_share: float | None = None) -> tuple[dict, dict | None, float]:
    """(mix, finish_mix, finish_share) of a run: without `mix`, the role's own (MIX, FINISH_MIX and its
    DEFAULTS' share); a `mix` given alone runs to the end, so the levers' recorded commands still
    reproduce."""
    if mix is None:
        mix, finish_mix = MIX[role], finish_mix or FINISH_MIX[role]
    if finish_share is None:
        finish_share = DEFAULTS[role].get("finish_share", FINISH_SHARE)
    return mix, finish_mix, finish_share


PHASE_KEYS = ("steps", "lr", "read_first", "mix", "finish_mix", "finish_share", "reason_tiers", "direct_tiers",
              "attend", "count_attend", "count_readout", "trace_attend", "trace_readout", "trace_kinds",
              "trace_heads", "number_init", "computed_weight", "answer_weight")


def load_schedule(path: str | Path) -> list[dict]:
    """The phases of a `--schedule` file: a JSON list, each phase a stage's settings (steps, lr, mix and
    optionally read_first, finish_mix, finish_share, reason_tiers, direct_tiers, attend, count_attend — the
    counting and copying heads' weight, `attend` unless given —, count_readout, `CountLens`'s weight,
    trace_attend, the trace's copying heads' weight, trace_readout, what the copy head copies said at
    its layer's output, trace_kinds, the kinds of `traced_copies` those two teach, `TRACE_KINDS` unless
    given, trace_heads, {kind: [layer, head]} for kinds taught at another head than `TRACE_HEADS`, and,
    read from the first phase as the run's start, number_init, `init_number_embeddings`; computed_weight,
    how many times a copied word the numbers a trace computes weigh in the loss, `computed_numbers`;
    answer_weight, the same for the answer after a reasoning target's trace),
    checked here so a typo fails before the first step, not after ten minutes."""
    phases = json.loads(Path(path).read_text())
    if not isinstance(phases, list) or not phases:
        raise ValueError(f"{path}: a schedule is a non-empty JSON list of phases")
    for n, phase in enumerate(phases, 1):
        if unknown := set(phase) - set(PHASE_KEYS):
            raise ValueError(f"{path}: phase {n} has unknown keys {sorted(unknown)}; known: {', '.join(PHASE_KEYS)}")
        if not (isinstance(phase.get("steps"), int) and phase["steps"] > 0 and phase.get("lr", 0) > 0
                and phase.get("mix")):
            raise ValueError(f"{path}: phase {n} needs steps (> 0), lr (> 0) and a mix")
        for key in ("mix", "finish_mix"):
            if unknown := set(phase.get(key) or {}) - set(OBJECTIVES):
                raise ValueError(f"{path}: phase {n}'s {key} names unknown objectives {sorted(unknown)}")
        if unknown := (set(phase.get("trace_kinds", ())) | set(phase.get("trace_heads", {}))) - set(TRACE_HEADS):
            raise ValueError(f"{path}: phase {n}'s trace_kinds or trace_heads names unknown kinds {sorted(unknown)}")
        for kind, where in phase.get("trace_heads", {}).items():
            if not (isinstance(where, list) and len(where) == 2 and all(isinstance(x, int) and x >= 0 for x in where)):
                raise ValueError(f"{path}: phase {n}'s trace_heads gives {kind} {where!r}, not [layer, head]")
        for key in ("computed_weight", "answer_weight"):
            if not (isinstance(phase.get(key, 1.0), (int, float)) and phase.get(key, 1.0) > 0):
                raise ValueError(f"{path}: phase {n}'s {key} must be a number > 0")
        for key in ("reason_tiers", "direct_tiers"):
            if unknown := set(phase.get(key) or {}) - set(TIERS):
                raise ValueError(f"{path}: phase {n}'s {key} names unknown tiers {sorted(unknown)}")
    return [phase_settings(phase) for phase in phases]


def phase_settings(phase: dict) -> dict:
    """A phase with every setting it leaves out at its default (a schedule's, or the one phase of a run
    from the command line); the same phase again when it has them all."""
    return {"read_first": 0.0, "finish_mix": None, "finish_share": None, "reason_tiers": None,
            "direct_tiers": None, "attend": 0.0, "count_attend": phase.get("attend", 0.0), "count_readout": 0.0,
            "trace_attend": 0.0, "trace_readout": 0.0, "trace_kinds": TRACE_KINDS, "computed_weight": 1.0,
            "answer_weight": 1.0, **phase,
            "trace_heads": trace_heads(phase)}


def trace_heads(phase: dict) -> dict[str, tuple[int, int]]:
    """{kind: (layer, head)} a phase teaches each kind of a trace's copies at: `TRACE_HEADS` unless its
    `trace_heads` moves some."""
    return {**TRACE_HEADS, **{kind: tuple(where) for kind, where in phase.get("trace_heads", {}).items()}}


def phase_of(phases: list[dict], step: int) -> tuple[int, int]:
    """(phase index, step within that phase) of a run's step."""
    for index, phase in enumerate(phases):
        if step < phase["steps"]:
            return index, step
        step -= phase["steps"]
    raise IndexError("step past the schedule's end")


OBJECTIVES = ("direct", "reason", "transfer", "caption", "lookup", "tally", "census")
