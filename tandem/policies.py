"""The policies, declared once: name, the models each always runs, its one parameter (type, bounds,
the config field holding its default) and its run function. Config literals, the model ids of the
OpenAI API (`tandem:<policy>` and `tandem:<policy>@<value>`) and the pipeline all read `POLICIES`.

Transfer decisions are pure functions that return the inputs they decided from; a run function
composes the pipeline's stages (`pipeline._Run`: direct answers, reasoning, transfer) around them.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from tandem.agreement import answers_agree, normalize_answer
from tandem.chat_schema import short
from tandem.errors import BadRequest
from tandem.schemas import Decision


# --- decisions ----------------------------------------------------------------------------------------
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


def decide_confidence_mutual(small_answer: str, large_answer: str, logprobs: list[float],
                             threshold: float) -> Decision:
    """Transfer when the direct answers disagree or, when they agree, the large model is unsure."""
    mutual, confident = decide_mutual(small_answer, large_answer), decide_confidence(logprobs, threshold)
    transfer = mutual.transfer or confident.transfer
    reason = mutual.reason if mutual.transfer else ("agree, low confidence" if transfer else "agree, confident")
    return Decision(transfer, reason, {**mutual.inputs, **confident.inputs})


def decide_random(p: float, rng: random.Random) -> Decision:
    draw = rng.random()
    return Decision(transfer=draw < p, reason="random draw", inputs={"draw": draw, "p": p})


# --- the table ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """A policy's one parameter: a number in [low, high], its default read from `PolicyConfig`."""

    name: str  # as the trace and error messages call it
    config_field: str  # the PolicyConfig field holding the default
    low: float = 0.0
    high: float = 1.0
    description: str = ""

    def parse(self, text: str, policy: str) -> float:
        """`text` from a model id (`tandem:<policy>@<text>`), or a 400 naming the parameter."""
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not self.low <= value <= self.high:  # NaN fails this too
            raise BadRequest(f"model 'tandem:{policy}@...': {policy}'s {self.name} must be a number from "
                             f"{self.low:g} to {self.high:g}; got {short(text)}", param="model")
        return value


Run = Any  # pipeline._Run: the stages of one request (kept untyped here: the pipeline imports this module)
Outcome = tuple[str, Any, Decision | None]  # (path, the final GenerationOutput, the decision)


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    # The models it is sure to run: their images are encoded up front, concurrently. A model that a
    # decision may still call (confidence's small one) is encoded once the decision needs it.
    roles: tuple[str, ...]
    run: Callable[[Run, float | None], Awaitable[Outcome]]
    param: Param | None = None


async def _large(run: Run, _) -> Outcome:
    return "large", await run.direct("large", final=True), None


async def _small(run: Run, _) -> Outcome:
    return await run.reason_then_answer("small")


async def _large_reasoning(run: Run, _) -> Outcome:
    return await run.reason_then_answer("large")


async def _always(run: Run, _) -> Outcome:
    return await run.transfer_or_answer(Decision(True, "always transfer"))


async def _mutual(run: Run, _) -> Outcome:
    speculative = run.speculative_reasoning()
    try:
        small, large = await asyncio.gather(run.direct("small"), run.direct("large"))
    except BaseException:
        speculative.cancel()
        raise
    decision = decide_mutual(small.text, large.text)
    decision.inputs["speculative"] = speculative.started
    return await run.transfer_or_answer(decision, large, "agree", speculative)


async def _confidence(run: Run, threshold: float) -> Outcome:
    large = await run.direct("large", logprobs=True)
    return await run.transfer_or_answer(decide_confidence(large.logprobs, threshold), large)


async def _confidence_mutual(run: Run, threshold: float) -> Outcome:
    small, large = await asyncio.gather(run.direct("small"), run.direct("large", logprobs=True))
    decision = decide_confidence_mutual(small.text, large.text, large.logprobs, threshold)
    return await run.transfer_or_answer(decision, large, "agree" if decision.inputs["agree"] else "large")


async def _random(run: Run, p: float) -> Outcome:
    decision = decide_random(p, run.rng)
    if decision.transfer:
        return await run.transfer_or_answer(decision)
    return "large", await run.direct("large", final=True), decision


THRESHOLD = Param("threshold", "confidence_threshold",
                  description="transfer when the large model's mean answer-token probability is under it")
POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("large", "the large model answers directly", ("large",), _large),
    Policy("small", "the small model reasons, then answers", ("small",), _small),
    Policy("large_reasoning", "the large model reasons, then answers", ("large",), _large_reasoning),
    Policy("always", "the small model reasons; its key tokens go to the large model, which answers",
           ("small", "large"), _always),
    Policy("mutual", "both answer directly; the small model's reasoning is transferred when they disagree",
           ("small", "large"), _mutual),
    Policy("confidence", "the large model answers; transfer when its confidence is under the threshold",
           ("large",), _confidence, THRESHOLD),
    Policy("confidence_mutual", "as mutual, and also transfer when they agree but the large model's "
           "confidence is under the threshold", ("small", "large"), _confidence_mutual, THRESHOLD),
    # The small model only runs when the draw says transfer: nothing is encoded up front.
    Policy("random", "transfer with probability p (a baseline)", (), _random,
           Param("p", "random_transfer_p", description="probability of a transfer")),
)}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)


def parse_policy_id(name: str) -> tuple[str, float | None]:
    """`<policy>` or `<policy>@<value>` -> (policy, value or None); KeyError for an unknown policy,
    BadRequest (400) for a parameter the policy does not take or a value out of its bounds."""
    policy, at, text = name.partition("@")
    spec = POLICIES[policy]
    if not at:
        return policy, None
    if spec.param is None:
        raise BadRequest(f"model 'tandem:{policy}@...': policy '{policy}' takes no parameter", param="model")
    return policy, spec.param.parse(text, policy)
