"""Wire types that travel between the router and the model servers (and between pipeline stages).

Plain dataclasses of Python values and CPU tensors, so they pickle through Ray's object store as they
are. What a request asks, what a model is asked, what it answers, and the trace that comes back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    stop: tuple[str, ...] = ()
    logprobs: bool = False  # keep each chosen token's log-probability (the confidence policy needs them)
    top_p: float = 1.0
    top_k: int = 0  # 0: no cut
    # Reasoning the request set no temperature for: the engine samples as the checkpoint's own
    # generation_config says (a thinking model's card advises against greedy: it loops to the cap).
    model_defaults: bool = False


@dataclass
class ImageFeatures:
    """One image encoded by one model's vision tower: what that model's decoder needs instead of pixels.

    For Qwen3-VL: the merged patch embeddings (`embeds`, n_tokens x hidden), one tensor per DeepStack
    layer (`deepstack`), and the patch grid (t, h, w) that fixes the number of placeholder tokens and
    the 3D rotary positions.
    """

    model: str
    embeds: Any
    deepstack: list[Any]
    grid_thw: tuple[int, int, int]
    merge_size: int

    @property
    def num_tokens(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w // (self.merge_size**2)


@dataclass
class GenerationRequest:
    """One prompt for a model server: the full prompt text with one placeholder per image, and the
    precomputed features of those images in the order they appear (under Serve, references to
    them in the object store until the model server fetches them)."""

    prompt: str
    images: list[ImageFeatures] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""
    # A segment of the prompt (the small model's reasoning) whose tokens should be scored by the
    # attention the generated answer pays them; for the `attention` selector.
    attend_to: str | None = None
    # Other requests the sender was answering when it sent this one: more stages may come within a
    # batch wait, so waiting for them can pay (0: this one is alone; an idle model server starts it at once).
    company: int = 0


@dataclass
class GenerationOutput:
    text: str
    token_ids: list[int]
    token_texts: list[str]
    logprobs: list[float]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (eos or stop string) or "length"
    latency_ms: float
    ttft_ms: float
    batch_size: int = 1  # the most requests this one shared decoding steps with
    decode_steps: int = 0  # steps this request was decoded for (its own, not its batch's)
    decode_ms: float = 0.0  # from its prefill to its last token
    queue_ms: float = 0.0  # waiting to join a batch
    cached_tokens: int = 0  # prompt tokens whose KV came from the engine's prefix cache
    replica: str = ""  # the model server replica that ran it (set by the deployment)
    span_token_texts: list[str] = field(default_factory=list)  # the `attend_to` segment, tokenised
    span_scores: list[float] = field(default_factory=list)  # attention paid to each of those tokens


@dataclass
class TokenDelta:
    """Text decoded since the last delta of a streamed generation (a token or a few)."""

    text: str


@dataclass
class AskRequest:
    """A question as the pipeline takes it: images as raw bytes (already validated by the ingress)."""

    question: str
    images: list[bytes] = field(default_factory=list)
    policy: str | None = None
    policy_param: float | None = None  # `tandem:<policy>@<value>`; None: the config's
    max_tokens: int | None = None
    temperature: float | None = None  # None: the request set none (answers greedy, reasoning as the model says)
    request_id: str = ""
    stream_reasoning: bool = False  # when streamed: the reasoning on the answer's path, as it is decoded
    reasoning_max_tokens: int | None = None  # the request's reasoning budget (within the config's)
    latency_budget_ms: float | None = None  # reasoning is shortened or skipped to answer within it
    reasoning_effort: dict | None = None  # what a `reasoning_effort` applied, echoed in the trace


@dataclass
class Decision:
    """Whether to transfer, and the inputs the decision was made from (so benchmarks can count them)."""

    transfer: bool
    reason: str
    inputs: dict[str, Any] = field(default_factory=dict)


@dataclass
class TandemResult:
    answer: str
    policy: str
    path: str
    decision: Decision | None
    latency_ms: dict[str, float]
    tokens: dict[str, int]
    transferred_tokens: int
    prompt_tokens: int
    completion_tokens: int
    images_encoded: dict[str, int]
    cached_tokens: int = 0  # prompt tokens of every stage served from an engine's prefix cache
    finish_reason: str = "stop"
    degraded: bool = False
    reasoning_excerpt: str = ""
    request_id: str = ""
    stages: dict[str, dict] = field(default_factory=dict)  # per stage: decode steps and ms, ttft, batch size
    params: dict[str, float] = field(default_factory=dict)  # the policy's parameter, as used
    budget: dict | None = None  # what a latency budget made of the reasoning: action, predicted and actual ms
    reasoning: str = ""  # the whole reasoning the answer's path generated (the excerpt is what was transferred)
    reasoning_effort: dict | None = None  # what the request's `reasoning_effort` applied

    @property
    def reasoning_tokens(self) -> int:
        """Tokens generated by reasoning stages (OpenAI's completion_tokens_details.reasoning_tokens)."""
        return sum(n for stage, n in self.tokens.items() if stage.endswith("_reasoning"))

    @property
    def agreement(self) -> bool | None:
        if self.decision is None or "agree" not in self.decision.inputs:
            return None
        return bool(self.decision.inputs["agree"])

    def trace(self) -> dict[str, Any]:
        """The `tandem` object returned to clients and printed by `tandem ask --json`."""
        return {
            "policy": self.policy,
            **({"params": dict(self.params)} if self.params else {}),
            "path": self.path,
            "agreement": self.agreement,
            "decision": None if self.decision is None else {
                "transfer": self.decision.transfer, "reason": self.decision.reason, **self.decision.inputs},
            "latency_ms": {k: round(v, 3) for k, v in self.latency_ms.items()},
            "tokens": dict(self.tokens),
            "stages": {k: dict(v) for k, v in self.stages.items()},
            "transferred_tokens": self.transferred_tokens,
            "images_encoded": dict(self.images_encoded),
            "degraded": self.degraded,
            **({"budget": dict(self.budget)} if self.budget else {}),
            **({"reasoning_effort": dict(self.reasoning_effort)} if self.reasoning_effort else {}),
        }
