"""The Router's stage calls when the model replica a call reached dies before answering: the call is
sent again (a dead replica is dropped from the handle's choices), unless its stream already
forwarded text or it ran out of tries; then the client gets a 503 it may retry."""

from __future__ import annotations

import asyncio

import pytest
from ray.exceptions import ActorDiedError

from deployments.router import _generate_stage
from tandem.errors import ReplicaLost
from tandem.schemas import GenerationOutput, GenerationRequest, SamplingParams, TokenDelta

OUTPUT = GenerationOutput(text="four", token_ids=[1], token_texts=["four"], logprobs=[0.0], prompt_tokens=3,
                          completion_tokens=1, finish_reason="stop", latency_ms=1.0, ttft_ms=1.0)


class Events:
    """A streamed call: its deltas, then its output, or a death after `die_after` deltas."""

    def __init__(self, die_after: int | None):
        self.die_after, self.cancelled = die_after, False

    async def __aiter__(self):
        for i, text in enumerate(["fo", "ur"]):
            if i == self.die_after:
                raise ActorDiedError()
            yield TokenDelta(text=text)
        yield OUTPUT

    def cancel(self):
        self.cancelled = True


class Handle:
    """What the Router's stage calls of a deployment handle: each call takes the next outcome."""

    def __init__(self, outcomes):
        self.outcomes, self.sent = list(outcomes), 0
        self.generate = self.stream = self

    def options(self, stream: bool):
        return self

    def remote(self, request):
        self.sent += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Events):
            return outcome

        async def answer():
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        return answer()


def request() -> GenerationRequest:
    return GenerationRequest("which one?", [], SamplingParams(max_tokens=2), request_id="lost")


def test_a_call_whose_replica_died_is_sent_again_and_answered():
    handle = Handle([ActorDiedError(), ActorDiedError(), OUTPUT])
    assert asyncio.run(_generate_stage(handle)(request())) is OUTPUT
    assert handle.sent == 3


def test_a_call_that_finds_no_live_replica_in_its_tries_is_a_503():
    handle = Handle([ActorDiedError()] * 3)
    with pytest.raises(ReplicaLost) as err:
        asyncio.run(_generate_stage(handle)(request()))
    assert err.value.status == 503 and err.value.retry_after_s == 1 and handle.sent == 3


def test_a_failure_that_is_not_a_lost_replica_is_not_sent_again():
    handle = Handle([ValueError("bad row"), OUTPUT])
    with pytest.raises(ValueError):
        asyncio.run(_generate_stage(handle)(request()))
    assert handle.sent == 1


def test_a_stream_that_died_before_its_first_text_is_sent_again():
    handle, texts = Handle([Events(die_after=0), Events(die_after=None)]), []
    assert asyncio.run(_generate_stage(handle)(request(), texts.append)) is OUTPUT
    assert texts == ["fo", "ur"] and handle.sent == 2


def test_a_stream_that_already_forwarded_text_is_not_sent_again():
    handle, texts = Handle([Events(die_after=1), Events(die_after=None)]), []
    with pytest.raises(ReplicaLost):
        asyncio.run(_generate_stage(handle)(request(), texts.append))
    assert texts == ["fo"] and handle.sent == 1
