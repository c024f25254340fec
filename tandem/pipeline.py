"""The Tandem pipeline: one async function per request over three injected stages.

`Stages.encode(images, role)` turns image bytes into that role's features; `Stages.small(request,
sink)` and `Stages.large(request, sink)` generate, handing each decoded piece of text to `sink` when
one is given (streaming). In-process they call engines; under Serve they are deployment handles. The
pipeline encodes each image once per model per request, reuses the features across stages, runs
independent stages concurrently, and returns the path it took with the per-stage latency, token
counts and batching. It knows nothing of Ray, HTTP or tokenizers.

Streaming (`answer(request, on_delta)`): the stage that makes the final answer streams its text as
"content" as soon as the path is known; reasoning stages on the answer's path stream as "reasoning"
when the request asks (`stream_reasoning`). An answer decided after it was made (mutual's agreement,
confidence above its threshold) has nothing left to stream: the caller sends it whole.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from tandem import prompts
from tandem.budget import StageEstimates, plan_reasoning
from tandem.config import TandemConfig
from tandem.errors import FeaturesLost, NotFound, StageTimeout, client_error
from tandem.policies import POLICIES, POLICY_NAMES, Outcome
from tandem.schemas import (AskRequest, Decision, GenerationOutput, GenerationRequest, ImageFeatures,
                            SamplingParams, TandemResult)
from tandem.selectors import select_reasoning

EncodeStage = Callable[[list[bytes], str], Awaitable[list[ImageFeatures]]]
TextSink = Callable[[str], None]
GenerateStage = Callable[[GenerationRequest, TextSink | None], Awaitable[GenerationOutput]]
logger = logging.getLogger(__name__)
# The decision's reason on a degraded answer: fixed, so no internals of the failure reach a client.
SMALL_FAILED = "small model unavailable; answered by the large model alone"
DeltaSink = Callable[[str, str], None]  # (kind: "content" | "reasoning", text)


@dataclass
class Stages:
    encode: EncodeStage
    small: GenerateStage
    large: GenerateStage


class Pipeline:
    def __init__(self, config: TandemConfig, stages: Stages, *, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.config = config
        self.stages = stages
        self.rng = rng or random.Random(config.policy.seed)
        self.clock = clock
        self.estimates = StageEstimates()  # what latency budgets are planned from
        self.in_flight = 0  # requests being answered now: each stage tells its model server (`company`)

    async def answer(self, request: AskRequest, on_delta: DeltaSink | None = None) -> TandemResult:
        policy = request.policy or self.config.policy.default
        if policy not in POLICIES:
            raise NotFound(f"unknown policy '{policy}'; known: {', '.join(POLICY_NAMES)}", param="model")
        self.in_flight += 1
        try:
            return await self._answer(request, policy, on_delta)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: AskRequest, policy: str, on_delta: DeltaSink | None) -> TandemResult:
        run = _Run(self, request, policy, on_delta)
        try:
            path, final, decision = await run.spec.run(run, run.param)
        except _SmallFailed as failed:
            if self.config.policy.on_small_failure == "fail":
                raise failed.__cause__ from None
            # The small model is down or failing: answer with the large model alone, and say so. The
            # cause is logged here, never sent: it can carry a replica's traceback and address.
            logger.warning("request %s: small model failed (%s); answering with the large model",
                           request.request_id, type(failed.__cause__).__name__)
            run.degraded = True
            decision = Decision(False, SMALL_FAILED)
            path, final = "large", await run.direct("large")
        run.latency_ms["total"] = run.elapsed_ms()
        return run.result(path, final, decision)


class _SmallFailed(Exception):
    """A small-model stage failed; raised from the original error, which is its __cause__."""


class _Gate:
    """Holds a stage's streamed text until the path that uses it is chosen (mutual's speculative
    reasoning), then passes everything on; closed for good if the path is not taken."""

    def __init__(self, sink: TextSink):
        self.sink, self.held, self.is_open = sink, [], False

    def __call__(self, text: str) -> None:
        if self.is_open:
            self.sink(text)
        else:
            self.held.append(text)

    def open(self) -> None:
        self.is_open = True
        for text in self.held:
            self.sink(text)
        self.held = []


class _Speculation:
    """`mutual`'s small-model reasoning started during stage 1 (`policy.speculative`), its streamed
    text held until the path is chosen. Off under a latency budget, which sizes the reasoning only
    once it knows how much time stage 1 took."""

    def __init__(self, run: "_Run"):
        on = run.cfg.policy.speculative and run.req.latency_budget_ms is None
        self.gate = _Gate(run.reasoning_sink) if on and run.reasoning_sink else None
        self.future = asyncio.ensure_future(self._reason(run)) if on else None

    async def _reason(self, run: "_Run"):
        out = await run.reason("small", self.gate)
        # It ran beside the small model's direct stage, whose prompt head was not kept yet: say so.
        stage = run.stages.get("small_reasoning")
        if stage is not None and not stage["cached_tokens"]:
            stage["reuse"] = "none: ran at once with small_direct"
        return out

    @property
    def started(self) -> bool:
        return self.future is not None

    def cancel(self) -> None:
        if self.future:
            self.future.cancel()

    def take(self) -> asyncio.Future | None:
        """The reasoning, its held text released to the stream."""
        if self.gate:
            self.gate.open()
        return self.future


class _Run:
    """The state of one request: its policy and parameter, its feature tasks, its stage timings,
    token counts and batching, and what its latency budget made of its reasoning."""

    def __init__(self, pipeline: Pipeline, request: AskRequest, policy: str, on_delta: DeltaSink | None = None):
        self.p, self.req, self.policy = pipeline, request, policy
        self.cfg = pipeline.config
        self.spec = POLICIES[policy]
        self.param = None if self.spec.param is None else (
            request.policy_param if request.policy_param is not None
            else getattr(self.cfg.policy, self.spec.param.config_field))
        self.rng = pipeline.rng
        self.on_delta = on_delta
        self.start = pipeline.clock()
        self.latency_ms: dict[str, float] = {}
        self.tokens: dict[str, int] = {}
        self.stages: dict[str, dict] = {}
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.images_encoded: dict[str, int] = {}
        self.transferred_tokens = 0
        self.excerpt = ""
        self.degraded = False
        self.reasoning = ""  # the reasoning on the answer's path, whole
        self.budget: dict | None = None
        self._features: dict[str, asyncio.Future] = {}
        self._direct: dict[str, asyncio.Future] = {}
        for role in self.spec.roles:
            self.features(role)

    def elapsed_ms(self) -> float:
        return (self.p.clock() - self.start) * 1000

    # --- stages --------------------------------------------------------------------------------
    def features(self, role: str) -> asyncio.Future:
        if role not in self._features:
            self._features[role] = asyncio.ensure_future(self._encode(role))
        return self._features[role]

    async def _call(self, stage: str, role: str, call: Awaitable):
        """Await one stage call under the stage deadline; a small-model failure is marked as such."""
        timeout = self.cfg.limits.stage_timeout_s
        try:
            try:
                return await asyncio.wait_for(call, timeout)
            except asyncio.TimeoutError:
                raise StageTimeout(f"stage '{stage}' exceeded its {timeout} s deadline", param=stage) from None
        except FeaturesLost:
            raise  # generate() encodes again and retries, once
        except Exception as err:
            if (refused := client_error(err)) is not None:
                raise refused from None  # the client's fault, whichever model said so: its 4xx
            if role == "small":
                raise _SmallFailed(stage) from err
            raise

    async def _encode(self, role: str) -> list[ImageFeatures]:
        if not self.req.images:
            return []
        start = self.p.clock()
        feats = await self._call(f"encode_{role}", role, self.p.stages.encode(self.req.images, role))
        self.latency_ms[f"encode_{role}"] = (self.p.clock() - start) * 1000
        self.p.estimates.observe(f"encode_{role}", self.latency_ms[f"encode_{role}"])
        self.images_encoded[role] = self.images_encoded.get(role, 0) + len(self.req.images)
        return feats

    # --- streaming sinks ---------------------------------------------------------------------------
    @property
    def content(self) -> TextSink | None:
        """Where the final answer's text goes as it is decoded."""
        return (lambda text: self.on_delta("content", text)) if self.on_delta else None

    @property
    def reasoning_sink(self) -> TextSink | None:
        if self.on_delta and self.req.stream_reasoning:
            return lambda text: self.on_delta("reasoning", text)
        return None

    async def generate(self, stage: str, role: str, prompt: str, max_tokens: int,
                       stop: tuple[str, ...] = (), attend_to: str | None = None,
                       sink: TextSink | None = None, logprobs: bool = False) -> GenerationOutput:
        # A request's temperature applies to every stage; without one, answers are greedy and a
        # reasoning samples as its model's generation_config says.
        temperature = self.req.temperature
        sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature or 0.0, stop=stop, logprobs=logprobs,
                                  model_defaults=temperature is None and stage.endswith("_reasoning"))
        start = None
        for attempt in (1, 2):
            feats = await self.features(role)
            if start is None:  # the stage's time starts once its features are there
                start = self.p.clock()
            request = GenerationRequest(prompt=prompt, images=feats, attend_to=attend_to,
                                        request_id=self.req.request_id, sampling=sampling,
                                        company=self.p.in_flight - 1)
            try:
                out = await self._call(stage, role, getattr(self.p.stages, role)(request, sink))
                break
            except FeaturesLost as err:
                # The features' owner is gone (a VisionEncoder replica scaled down or died): the
                # images are encoded again, by a live replica, and the stage runs again, once.
                self._features.pop(role, None)
                if attempt == 2:
                    if role == "small":
                        raise _SmallFailed(stage) from err
                    raise
        self.latency_ms[stage] = (self.p.clock() - start) * 1000
        self.tokens[stage] = out.completion_tokens
        per_token = out.decode_ms / (out.decode_steps - 1) if out.decode_steps > 1 else None
        self.p.estimates.observe(stage, self.latency_ms[stage], out.completion_tokens, per_token)
        self.prompt_tokens += out.prompt_tokens
        self.cached_tokens += out.cached_tokens
        self.stages[stage] = {"prompt_tokens": out.prompt_tokens, "cached_tokens": out.cached_tokens,
                              "decode_steps": out.decode_steps,
                              "decode_ms": round(out.decode_ms, 3), "ttft_ms": round(out.ttft_ms, 3),
                              "queue_ms": round(out.queue_ms, 3), "batch_size": out.batch_size,
                              **({"replica": out.replica} if out.replica else {}),
                              # time per output token after the first (the engine's own clock)
                              "tpot_ms": round((out.latency_ms - out.ttft_ms) / (out.decode_steps - 1), 3)
                              if out.decode_steps > 1 else None}
        return out

    @property
    def answer_tokens(self) -> int:
        return self.req.max_tokens or self.cfg.limits.answer_max_tokens

    def fmt(self, role: str) -> str:
        return self.cfg.model(role).reasoning_format

    @property
    def n_images(self) -> int:
        return len(self.req.images)

    def direct(self, role: str, final: bool = False, logprobs: bool = False) -> asyncio.Future:
        """The role's direct answer, started once per request: a degraded fallback after a small-model
        failure reuses the large model's stage-1 answer instead of generating it again. `final`: it is
        the answer (streamed); `logprobs`: keep its tokens' log-probabilities."""
        if role not in self._direct:
            prompt = prompts.direct_prompt(self.req.question, self.n_images, self.fmt(role))
            self._direct[role] = asyncio.ensure_future(
                self.generate(f"{role}_direct", role, prompt, self.answer_tokens,
                              sink=self.content if final else None, logprobs=logprobs))
        return self._direct[role]

    @property
    def reasoning_cap(self) -> int:
        """The request's own reasoning budget, never above the config's limit (nor is it past the ingress)."""
        limit = self.cfg.limits.reasoning_max_tokens
        return min(self.req.reasoning_max_tokens or limit, limit)

    def plan(self, role: str, after: tuple[str, ...]) -> int | None:
        """The reasoning tokens this request can afford before `after` (the stages its answer still
        needs), under its latency budget: the cap without one; None when no reasoning fits."""
        budget = self.req.latency_budget_ms
        if budget is None:
            return self.reasoning_cap
        est = self.p.estimates
        rest = [est.get(s) for s in after] + [est.get(f"encode_{r}") for r in self._encodes_ahead(role, after)]
        plan = plan_reasoning(budget, self.elapsed_ms(), self.reasoning_cap,
                              self.cfg.policy.budget_min_reasoning_tokens, est.get(f"{role}_reasoning"), rest)
        self.budget = {"latency_budget_ms": budget, "action": plan.action,
                       "reasoning_max_tokens": plan.reasoning_max_tokens,
                       "predicted_ms": None if plan.predicted_ms is None else round(plan.predicted_ms, 3)}
        return plan.reasoning_max_tokens

    def _encodes_ahead(self, role: str, after: tuple[str, ...]) -> list[str]:
        """The roles whose features a reasoning by `role` and the stages `after` it still wait for:
        the role's own until they are there, and the large model's when its encode has not even
        started (`random` starts it at the transfer)."""
        if not self.req.images:
            return []
        ahead = [] if role in self._features and self._features[role].done() else [role]
        if role != "large" and "large" not in self._features and any(s.startswith("large_") for s in after):
            ahead.append("large")
        return ahead

    async def reason(self, role: str, sink: TextSink | None = None,
                     max_tokens: int | None = None) -> tuple[str, list[str], str]:
        """Reasoning only: returns (prompt, reasoning token texts, reasoning text)."""
        fmt = self.fmt(role)
        prompt = prompts.reasoning_prompt(self.req.question, self.n_images, fmt)
        out = await self.generate(f"{role}_reasoning", role, prompt, max_tokens or self.reasoning_cap,
                                  stop=(prompts.reasoning_stop(fmt),), sink=sink)
        return prompt, out.token_texts, out.text

    async def reason_then_answer(self, role: str) -> Outcome:
        """`small` and `large_reasoning`: the role reasons, then answers; under a latency budget that
        leaves no time to reason, it answers directly."""
        path = "small" if role == "small" else "large_reasoning"
        max_tokens = self.plan(role, (f"{role}_answer",))
        if max_tokens is None:
            return f"{role}_direct", await self.direct(role, final=True), None
        prompt, _, reasoning = await self.reason(role, self.reasoning_sink, max_tokens)
        self.reasoning = reasoning
        follow = prompts.answer_after_reasoning(prompt, reasoning, self.fmt(role))
        return path, await self.generate(f"{role}_answer", role, follow, self.answer_tokens, sink=self.content), None

    def speculative_reasoning(self) -> "_Speculation":
        return _Speculation(self)

    async def transfer_or_answer(self, decision: Decision, answered: GenerationOutput | None = None,
                                 kept_path: str = "large", speculation: "_Speculation | None" = None) -> Outcome:
        """Carry a decision out: without a transfer, the large model's answer (`answered` when stage 1
        made it, else its direct answer) on `kept_path`; with one, the small model's reasoning (the
        speculative one when started) goes to the large model — unless the latency budget leaves no
        time to reason, when the large model answers directly."""
        if not decision.transfer:
            if speculation:
                speculation.cancel()
            return kept_path, answered or await self.direct("large", final=True), decision
        reasoning = speculation.take() if speculation else None
        if reasoning is None:
            after = ("large_transfer", "small_answer") if self.cfg.selector.kind == "attention" else ("large_transfer",)
            max_tokens = self.plan("small", after)
            if max_tokens is None:
                return "large", answered or await self.direct("large", final=True), decision
            reasoning = self.reason("small", self.reasoning_sink, max_tokens)
        return "transfer", await self.transfer(reasoning), decision

    async def transfer(self, reasoning: Awaitable[tuple[str, list[str], str]]) -> GenerationOutput:
        prompt, token_texts, text = await reasoning
        self.reasoning = text
        scores = None
        if self.cfg.selector.kind == "attention":
            # The small model answers after its reasoning; what that answer attended to is what matters.
            fmt = self.fmt("small")
            segment = prompts.sanitize(text).rstrip()
            out = await self.generate("small_answer", "small", prompts.answer_after_reasoning(prompt, text, fmt),
                                      self.answer_tokens, attend_to=segment)
            token_texts, scores = out.span_token_texts, out.span_scores
        start = self.p.clock()
        selection = select_reasoning(token_texts, self.cfg.selector, scores)
        self.latency_ms["selector"] = (self.p.clock() - start) * 1000
        self.transferred_tokens, self.excerpt = selection.token_count, selection.text
        prompt = prompts.transfer_prompt(self.req.question, self.n_images, selection.text, self.fmt("large"))
        return await self.generate("large_transfer", "large", prompt, self.answer_tokens, sink=self.content)

    def result(self, path: str, final: GenerationOutput, decision: Decision | None) -> TandemResult:
        return TandemResult(
            answer=final.text.strip(), policy=self.policy, path=path, decision=decision,
            latency_ms=self.latency_ms, tokens=self.tokens, transferred_tokens=self.transferred_tokens,
            prompt_tokens=self.prompt_tokens, completion_tokens=sum(self.tokens.values()),
            cached_tokens=self.cached_tokens, images_encoded=self.images_encoded, finish_reason=final.finish_reason,
            reasoning_excerpt=self.excerpt, request_id=self.req.request_id, degraded=self.degraded,
            stages=self.stages, params={self.spec.param.name: self.param} if self.spec.param else {},
            budget=self.budget and {**self.budget, "actual_ms": round(self.latency_ms["total"], 3)},
            reasoning=self.reasoning, reasoning_effort=self.req.reasoning_effort)
