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
    temperature: float = 0.0
    stop: tuple[str, ...] = ()


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
    batch_size: int = 1
    span_token_texts: list[str] = field(default_factory=list)  # the `attend_to` segment, tokenised
    span_scores: list[float] = field(default_factory=list)  # attention paid to each of those tokens


@dataclass
class AskRequest:
    """A question as the pipeline takes it: images as raw bytes (already validated by the ingress)."""

    question: str
    images: list[bytes] = field(default_factory=list)
    policy: str | None = None
    max_tokens: int | None = None
    temperature: float = 0.0
    request_id: str = ""


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
    finish_reason: str = "stop"
    degraded: bool = False
    reasoning_excerpt: str = ""
    request_id: str = ""

    @property
    def agreement(self) -> bool | None:
        if self.decision is None or "agree" not in self.decision.inputs:
            return None
        return bool(self.decision.inputs["agree"])

    def trace(self) -> dict[str, Any]:
        """The `tandem` object returned to clients and printed by `tandem ask --json`."""
        return {
            "policy": self.policy,
            "path": self.path,
            "agreement": self.agreement,
            "decision": None if self.decision is None else {
                "transfer": self.decision.transfer, "reason": self.decision.reason, **self.decision.inputs},
            "latency_ms": {k: round(v, 3) for k, v in self.latency_ms.items()},
            "tokens": dict(self.tokens),
            "transferred_tokens": self.transferred_tokens,
            "images_encoded": dict(self.images_encoded),
            "degraded": self.degraded,
        }
