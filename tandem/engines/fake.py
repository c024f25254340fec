"""A model-free engine that honours the whole engine contract (both roles), for orchestration tests and for measuring the bare
cost of the Serve composition. Answers come from a rule over the prompt, one word per decoding step;
every prefill is recorded."""

from __future__ import annotations

import time
from typing import Callable

from tandem.engines.decoding import DecodeLoop, LoopEngine, Prepared
from tandem.engines.protocol import VisionEngine
from tandem.errors import BadRequest
from tandem.images import image_digest
from tandem.prompts import IMAGE_PAD
from tandem.schemas import GenerationOutput, GenerationRequest, ImageFeatures, SamplingParams


def default_rule(answer_words: int = 1, reasoning_words: int = 64, answer: str = "A") -> Callable[[str], str]:
    """Reasoning prompts get a long deterministic thought; others `answer` (then more words)."""
    def rule(prompt: str) -> str:
        if prompt.endswith("<think>\n") or "Think step by step" in prompt.rsplit("<|im_start|>user", 1)[-1]:
            return " ".join(f"step{i}" for i in range(reasoning_words))
        return " ".join([answer] + [f"w{i}" for i in range(1, answer_words)])
    return rule


class FakeEngine(LoopEngine, VisionEngine):
    """Decodes the rule's words one per step under the same DecodeLoop as the transformers engine.
    `step_s` is a decode step's fixed cost whatever the batch size (as on a GPU), `delay_s` a
    prefill's."""

    stop_token_ids = {0}

    def __init__(self, name: str, rule: Callable[[str], str] | None = None, logprob: float = -0.1,
                 delay_s: float = 0.0, step_s: float = 0.0, max_prompt_tokens: int = 4096):
        self.name, self.logprob, self.delay_s, self.step_s = name, logprob, delay_s, step_s
        self.rule = rule or default_rule()
        self.max_prompt_tokens = max_prompt_tokens
        self.encoded: list[str] = []  # digests of the images encoded, in order
        self.batches: list[list[GenerationRequest]] = []  # requests prefilled together, in order
        self._words: dict[str, int] = {}  # id 0 is the stop token, never a word
        self._texts: list[str] = [""]
        self.loop = DecodeLoop(self, name=f"decode-{name}")

    def check_device(self) -> None:
        """No device: nothing to check."""

    def warm_up(self) -> None:
        """Nothing to warm; present so the fake honours the whole protocol."""

    def encode_images(self, images: list[bytes], model: str | None = None) -> list[ImageFeatures]:
        self.encoded.extend(image_digest(b) for b in images)
        return [ImageFeatures(model=model or self.name, embeds=image_digest(b), deepstack=[], grid_thw=(1, 2, 2),
                              merge_size=1) for b in images]

    # --- StepEngine -----------------------------------------------------------------------------
    def prepare(self, request: GenerationRequest) -> Prepared:
        if len(request.prompt) // 4 > self.max_prompt_tokens:
            raise BadRequest(f"prompt is over {self.max_prompt_tokens} tokens", param="messages")
        if request.prompt.count(IMAGE_PAD) != len(request.images):
            raise BadRequest("image placeholders and features differ in number")
        words = self.rule(request.prompt).split(" ")
        ids = [self._id(w if i == 0 else " " + w) for i, w in enumerate(words)]
        return Prepared(len(request.prompt) // 4, ids)

    def _id(self, text: str) -> int:
        if text not in self._words:
            self._words[text] = len(self._texts)
            self._texts.append(text)
        return self._words[text]

    def prefill(self, requests: list[GenerationRequest], prepared: list[Prepared]) -> list[list[int]]:
        self.batches.append(list(requests))
        if self.delay_s:
            time.sleep(self.delay_s)
        return [list(p.data) + [0] for p in prepared]  # each row's words, then the stop token

    def join(self, state: list, other: list) -> list:
        return state + other

    def keep(self, state: list, rows: list[int]) -> list:
        return [state[i] for i in rows]

    def choose(self, state: list, sampling: list[SamplingParams]) -> list[tuple[int, float | None]]:
        return [(row[0], self.logprob if s.logprobs else None) for row, s in zip(state, sampling)]

    def advance(self, state: list, token_ids: list[int]) -> None:
        if self.step_s:
            time.sleep(self.step_s)
        for row in state:
            row.pop(0)

    def detokenize(self, token_ids: list[int]) -> str:
        return "".join(self._texts[t] for t in token_ids)

    def finish(self, request: GenerationRequest, output: GenerationOutput) -> None:
        if request.attend_to is not None:
            # A stand-in for attention: words with a digit in them are the ones "looked at".
            seg = request.attend_to.split(" ")
            output.span_token_texts = [w if i == 0 else " " + w for i, w in enumerate(seg)]
            output.span_scores = [1.0 if any(c.isdigit() for c in w) else 0.1 for w in seg]
