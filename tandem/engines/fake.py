"""A model-free engine that honours both protocols, for orchestration tests and for measuring the bare
cost of the Serve composition. Answers come from a rule over the prompt; every call is recorded."""

from __future__ import annotations

import hashlib
import time
from typing import Callable

from tandem.errors import BadRequest
from tandem.images import image_digest
from tandem.prompts import IMAGE_PAD
from tandem.schemas import GenerationOutput, GenerationRequest, ImageFeatures


def default_rule(prompt: str) -> str:
    """Reasoning prompts get a long deterministic thought; others the letter A."""
    if prompt.endswith("<think>\n") or "Think step by step" in prompt.rsplit("<|im_start|>user", 1)[-1]:
        return " ".join(f"step{i}" for i in range(64))
    return "A"


class FakeEngine:
    def __init__(self, name: str, rule: Callable[[str], str] = default_rule, logprob: float = -0.1,
                 delay_s: float = 0.0, max_prompt_tokens: int = 4096):
        self.name, self.rule, self.logprob, self.delay_s = name, rule, logprob, delay_s
        self.max_prompt_tokens = max_prompt_tokens
        self.encoded: list[str] = []  # digests of the images encoded, in order
        self.batches: list[list[GenerationRequest]] = []

    def warm_up(self) -> None:
        """Nothing to warm; present so the fake honours the whole protocol."""

    def encode_images(self, images: list[bytes], model: str | None = None) -> list[ImageFeatures]:
        self.encoded.extend(image_digest(b) for b in images)
        return [ImageFeatures(model=model or self.name, embeds=image_digest(b), deepstack=[], grid_thw=(1, 2, 2),
                              merge_size=1) for b in images]

    def validate(self, request: GenerationRequest) -> None:
        if len(request.prompt) // 4 > self.max_prompt_tokens:
            raise BadRequest(f"prompt is over {self.max_prompt_tokens} tokens", param="messages")

    def generate(self, batch: list[GenerationRequest]) -> list[GenerationOutput]:
        self.batches.append(list(batch))
        if self.delay_s:
            time.sleep(self.delay_s)
        return [self._one(r, len(batch)) for r in batch]

    def _one(self, request: GenerationRequest, batch_size: int) -> GenerationOutput:
        if request.prompt.count(IMAGE_PAD) != len(request.images):
            raise ValueError("image placeholders and features differ in number")
        words = self.rule(request.prompt).split(" ")
        finish = "length" if len(words) > request.sampling.max_tokens else "stop"
        words = words[: request.sampling.max_tokens]
        texts = [w if i == 0 else " " + w for i, w in enumerate(words)]
        ids = [int(hashlib.md5(w.encode()).hexdigest()[:6], 16) for w in words]
        out = GenerationOutput(text="".join(texts), token_ids=ids, token_texts=texts,
                               logprobs=[self.logprob] * len(ids), prompt_tokens=len(request.prompt) // 4,
                               completion_tokens=len(ids), finish_reason=finish, latency_ms=self.delay_s * 1000,
                               ttft_ms=0.0, batch_size=batch_size)
        if request.attend_to is not None:
            # A stand-in for attention: words with a digit in them are the ones "looked at".
            seg = request.attend_to.split(" ")
            out.span_token_texts = [w if i == 0 else " " + w for i, w in enumerate(seg)]
            out.span_scores = [1.0 if any(c.isdigit() for c in w) else 0.1 for w in seg]
        return out
