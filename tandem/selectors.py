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


def select_reasoning(token_texts: list[str], config: SelectorConfig) -> Selection:
    n = len(token_texts)
    if config.kind == "full" or n <= config.budget_tokens:
        return _from_spans(token_texts, ((0, n),) if n else ())
    head = round(config.budget_tokens * config.head_fraction)
    tail = config.budget_tokens - head
    spans = tuple(s for s in ((0, head), (n - tail, n)) if s[1] > s[0])
    return _from_spans(token_texts, spans)


def _from_spans(token_texts: list[str], spans: tuple[tuple[int, int], ...]) -> Selection:
    text = ELISION.join("".join(token_texts[a:b]).strip() for a, b in spans)
    return Selection(text=text, token_count=sum(b - a for a, b in spans), spans=spans)
