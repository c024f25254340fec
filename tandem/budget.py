"""Latency budgets: live per-stage latency estimates, and the decision of how much reasoning a request
with a budget can afford.

Each stage's latency is modelled as fixed + per_token x tokens (fixed: queueing, prefill, calls;
per_token: one decoding step), both moving averages of what the stages recently measured, with the
mean deviation of the prediction error kept beside them as TCP keeps its round-trip variance
(RFC 6298): a plan adds `MARGIN` deviations of the path (the stages' deviations in quadrature), so a
budget is met unless the stages run slower than they have lately. A reasoning is planned at its cap
(`max_tokens`), which it never exceeds: reasoning that ends sooner only finishes sooner. The Router keeps one `StageEstimates` per replica, fed by every request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA, BETA = 0.125, 0.25  # RFC 6298's gains for the mean and the deviation
MARGIN = 2.0  # deviations of the path added to a plan: its safety against recent jitter


@dataclass
class Estimate:
    fixed_ms: float
    per_token_ms: float
    dev_ms: float = 0.0

    def ms(self, tokens: int = 0) -> float:
        """The expected time for `tokens` decoded tokens (no margin)."""
        return self.fixed_ms + self.per_token_ms * tokens


class StageEstimates:
    """Moving averages of each stage's fixed time and per-token time (keyed by stage name, e.g.
    `small_reasoning`, `large_transfer`, `encode_small`)."""

    def __init__(self):
        self.stages: dict[str, Estimate] = {}

    def observe(self, stage: str, latency_ms: float, tokens: int = 0, per_token_ms: float | None = None) -> None:
        est = self.stages.get(stage)
        if est is None:
            rate = per_token_ms or 0.0
            self.stages[stage] = Estimate(max(0.0, latency_ms - rate * tokens), rate)
            return
        err = latency_ms - est.ms(tokens)
        est.dev_ms += BETA * (abs(err) - est.dev_ms)
        if per_token_ms is not None:
            est.per_token_ms += ALPHA * (per_token_ms - est.per_token_ms)
        est.fixed_ms += ALPHA * (max(0.0, latency_ms - est.per_token_ms * tokens) - est.fixed_ms)

    def get(self, stage: str) -> Estimate | None:
        return self.stages.get(stage)


@dataclass
class BudgetPlan:
    """What a latency budget made of a request's reasoning: `full` (the whole cap fits), `shortened`
    (to `reasoning_max_tokens`), `direct` (not even `min_tokens` fit: answer without reasoning),
    or `no_estimate` (a stage not yet measured on this replica: run as without a budget)."""

    action: str
    reasoning_max_tokens: int | None
    predicted_ms: float | None


def plan_reasoning(budget_ms: float, elapsed_ms: float, cap: int, min_tokens: int,
                   reasoning: Estimate | None, rest: list[Estimate | None]) -> BudgetPlan:
    """How many reasoning tokens fit in what is left of the budget, given the reasoning stage's
    estimate and those of the stages that must still run around it (`rest`, predicted at their
    usual length: short answers, encodes)."""
    if reasoning is None or any(e is None for e in rest):
        return BudgetPlan("no_estimate", cap, None)
    stages = [reasoning, *rest]
    # The stages' errors are independent: their deviations add in quadrature, not one margin each.
    around = elapsed_ms + sum(e.ms() for e in stages) + MARGIN * math.hypot(*(e.dev_ms for e in stages))
    left = budget_ms - around
    fit = cap if reasoning.per_token_ms <= 0 else math.floor(left / reasoning.per_token_ms)
    if left >= 0 and fit >= cap:
        return BudgetPlan("full", cap, around + reasoning.per_token_ms * cap)
    if left >= 0 and fit >= min_tokens:
        return BudgetPlan("shortened", fit, around + reasoning.per_token_ms * fit)
    return BudgetPlan("direct", None, None)
