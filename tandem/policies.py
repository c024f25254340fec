"""Transfer decisions: pure functions that say whether the small model's reasoning goes to the large
model, each returning the inputs it decided from. The pipeline carries them out."""

from __future__ import annotations

import math
import random

from tandem.agreement import answers_agree, normalize_answer
from tandem.schemas import Decision

# The models each policy is sure to run: their images are encoded up front, concurrently. A model
# that a decision may still call (confidence, random) is encoded only once the decision needs it.
ROLES_ALWAYS_USED = {
    "large": ("large",), "small": ("small",), "large_reasoning": ("large",),
    "always": ("small", "large"), "mutual": ("small", "large"), "confidence": ("large",), "random": (),
}


def decide_mutual(small_answer: str, large_answer: str) -> Decision:
    """Stage-1 mutual verification: transfer only when the two direct answers disagree."""
    agree = answers_agree(small_answer, large_answer)
    return Decision(
        transfer=not agree,
        reason="answers agree" if agree else "answers disagree",
        inputs={"agree": agree, "small_answer": small_answer, "large_answer": large_answer,
                "small_normalized": normalize_answer(small_answer),
                "large_normalized": normalize_answer(large_answer)},
    )


def answer_confidence(logprobs: list[float]) -> float:
    """Geometric-mean probability of the answer tokens (0 for an empty answer)."""
    if not logprobs:
        return 0.0
    return math.exp(sum(logprobs) / len(logprobs))


def decide_confidence(logprobs: list[float], threshold: float) -> Decision:
    confidence = answer_confidence(logprobs)
    transfer = confidence < threshold
    return Decision(transfer=transfer,
                    reason="low confidence" if transfer else "confident",
                    inputs={"confidence": confidence, "threshold": threshold})


def decide_random(p: float, rng: random.Random) -> Decision:
    draw = rng.random()
    return Decision(transfer=draw < p, reason="random draw", inputs={"draw": draw, "p": p})
