"""Reasoning selectors: which of the small model's reasoning tokens are transferred to the large model.

A selector sees the reasoning as per-token texts and returns the kept spans, in their original
order, never more tokens than the budget allows (`full` keeps all, for ablations).
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.config import SelectorConfig

ELISION = " ... "


@dataclass(frozen=True)
class Selection:
    text: str
    token_count: int
    spans: tuple[tuple[int, int], ...]


def select_reasoning(token_texts: list[str], config: SelectorConfig, scores: list[float] | None = None) -> Selection:
    """`scores` (one per token, for `attention`): how much the small model's answer attended to each."""
    n = len(token_texts)
    if config.kind == "full" or n <= config.budget_tokens:
        return _from_spans(token_texts, ((0, n),) if n else ())
    if config.kind == "attention":
        if scores is None or len(scores) != n:
            raise ValueError(f"attention selector needs one score per token ({n}); got {len(scores or [])}")
        return _from_spans(token_texts, _top_spans(scores, config.span_tokens, config.budget_tokens))
    head = round(config.budget_tokens * config.head_fraction)
    tail = config.budget_tokens - head
    spans = tuple(s for s in ((0, head), (n - tail, n)) if s[1] > s[0])
    return _from_spans(token_texts, spans)


def _top_spans(scores: list[float], span: int, budget: int) -> tuple[tuple[int, int], ...]:
    """Fixed spans ranked by mean score; the best that fit the budget, back in reading order,
    adjacent ones merged."""
    spans = [(i, min(i + span, len(scores))) for i in range(0, len(scores), span)]
    ranked = sorted(spans, key=lambda s: (-sum(scores[s[0]:s[1]]) / (s[1] - s[0]), s[0]))
    kept, used = [], 0
    for a, b in ranked:
        if used + (b - a) <= budget:
            kept.append((a, b))
            used += b - a
    merged: list[tuple[int, int]] = []
    for a, b in sorted(kept):
        merged[-1:] = [(merged[-1][0], b)] if merged and merged[-1][1] == a else merged[-1:] + [(a, b)]
    return tuple(merged)


def _from_spans(token_texts: list[str], spans: tuple[tuple[int, int], ...]) -> Selection:
    text = ELISION.join("".join(token_texts[a:b]).strip() for a, b in spans)
    return Selection(text=text, token_count=sum(b - a for a, b in spans), spans=spans)
