"""The paced engine: the fake engine's rule-made answers under the same decode loop, taking the time
a stage profile says each step takes — a prefill by the joining rows' prompt tokens, a decode step
by the rows running, an encode by the images — as waits, not computation. A served app on it keeps
everything real but the models (Router, handles, queues, admission, batching, streaming), and its
service times no longer depend on the machine's CPU: what the capacity simulator's model of Serve is
checked against (`python -m capacity.sim_check --engine paced`). A decode step's wait counts from
the end of the step or prefill before it, so the loop's own CPU between them (choosing and handing on
tokens, admitting rows) falls inside the step's time, as it does in a step time measured on a model
server, instead of being added to it by this machine's load.

Each stage's prompt tokens and decode steps are the profile workload's for that stage; whether a
`mutual` request transfers is drawn per request id at the workload's transfer rate (the small model
answers D instead of C), the same draw on every replica."""

from __future__ import annotations

import hashlib
import time
from typing import Callable

from tandem.curves import Curve, generator_curves
from tandem.engines.decoding import Prepared
from tandem.engines.fake import FakeEngine
from tandem.prompts import REASON_INSTRUCTION, THINK_OPEN, TRANSFER_HEADER
from tandem.schemas import GenerationRequest, ImageFeatures


def transfers(request_id: str, rate: float) -> bool:
    """A request's draw: the same for every stage and replica that sees its id."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < rate


def stage_of(role: str, prompt: str) -> str:
    user = prompt.rsplit("<|im_start|>user", 1)[-1]
    if prompt.endswith(f"{THINK_OPEN}\n") or REASON_INSTRUCTION in user:
        return f"{role}_reasoning"
    if TRANSFER_HEADER in user:
        return f"{role}_transfer"
    return f"{role}_direct"


class PacedEngine(FakeEngine):
    def __init__(self, name: str, profile: dict, transfer_rate: float | None = None, max_prompt_tokens: int = 4096,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
        super().__init__(name, max_prompt_tokens=max_prompt_tokens)
        gen = profile["generators"][name]
        self.vision_ms = Curve([(p["images"], p["ms"]) for p in profile["vision"][name]])
        self.prefill_ms, self.step_ms = generator_curves(gen)
        workload = profile.get("workload", {})
        self.stages = workload.get("stages", {})
        self.transfer_rate = workload.get("transfer_rate", 0.0) if transfer_rate is None else transfer_rate
        self.sleep, self.clock = sleep, clock
        self._ended: float | None = None  # when the last prefill's or step's wait ended

    def encode_images(self, images: list[bytes], model: str | None = None) -> list[ImageFeatures]:
        self.sleep(self.vision_ms(len(images)) / 1000)
        return super().encode_images(images, model)

    def prepare(self, request: GenerationRequest) -> Prepared:
        stage = stage_of(self.name, request.prompt)
        sizes = self.stages.get(stage, {"prompt_tokens": 40, "decode_steps": 3})
        steps = max(1, round(sizes["decode_steps"]))
        if stage.endswith("_reasoning"):
            words = [f"step{i}" for i in range(steps)]
        else:
            # The answer, then blanks to the stage's length: the two direct answers agree unless the draw says not.
            answer = "D" if self.name == "small" and transfers(request.request_id, self.transfer_rate) else "C"
            words = [answer] + [""] * (steps - 1)
        ids = [self._id(w if i == 0 else " " + w) for i, w in enumerate(words)]
        # A row of n words takes n decode steps after its prefill (the stop token comes with the last),
        # as the simulator charges a call of n steps.
        return Prepared(max(1, round(sizes["prompt_tokens"])), ids)

    def prefill(self, requests: list[GenerationRequest], prepared: list[Prepared]) -> list[list[int]]:
        self.batches.append(list(requests))
        self._wait(self.prefill_ms(sum(p.prompt_tokens for p in prepared)), since_last=False)
        return [list(p.data) + [0] for p in prepared]

    def advance(self, state: list, token_ids: list[int]) -> None:
        # The loop steps straight on from the last prefill or step: the time since it ended is its own CPU.
        self._wait(self.step_ms(len(state)), since_last=True)
        for row in state:
            row.pop(0)

    def _wait(self, ms: float, since_last: bool) -> None:
        """Take `ms` from now, or (`since_last`) from the end of the last wait: only CPU work longer
        than the operation itself makes it take longer."""
        now = self.clock()
        start = self._ended if since_last and self._ended is not None else now
        self.sleep(max(0.0, start + ms / 1000 - now))
        self._ended = self.clock()
