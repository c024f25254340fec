"""Streaming and batching semantics in process, with fake engines whose decode step costs a fixed
time whatever the batch size (as on a GPU): what streams for each policy, that reasoning streams
only when asked and only on the path that uses it, that a short request is not held behind a long
one, that a finished row never waits for the prefill of rows joining after it, and that cancelled
rows stop decoding."""

import asyncio
import queue
import threading
import time

import pytest

from tandem.config import POLICY_NAMES, load_tandem_config
from tandem.engines.decoding import collect
from tandem.engines.fake import FakeEngine
from tandem.local import local_stages
from tandem.openai_api import AnswerStream
from tandem.pipeline import Pipeline
from tandem.schemas import AskRequest, GenerationRequest, SamplingParams, TokenDelta

from tests.conftest import make_png

REASONING = " ".join(f"r{i}" for i in range(20))


def rule(direct):
    def answer(prompt):
        if prompt.endswith("<think>\n") or "Think step by step" in prompt:
            return REASONING
        return direct
    return answer


def pipeline(small=" four legs ", large=" three legs ", step_s=0.0, **cfg):
    engines = {"small": FakeEngine("small", rule(small), step_s=step_s),
               "large": FakeEngine("large", rule(large), step_s=step_s)}
    config = load_tandem_config({"policy": {"confidence_threshold": 0.5}, **cfg})
    return Pipeline(config, local_stages(engines)), engines


async def streamed(p, policy, **kw):
    deltas = []
    result = await p.answer(AskRequest(question="How many legs?", images=[make_png(0)], policy=policy, **kw),
                            lambda kind, text: deltas.append((kind, text)))
    return result, deltas


@pytest.mark.parametrize("policy", POLICY_NAMES)
async def test_streamed_content_is_the_answer(policy):
    p, _ = pipeline()
    result, deltas = await streamed(p, policy)
    shown = AnswerStream()
    text = "".join(shown.feed(t) for kind, t in deltas if kind == "content")
    assert text + shown.rest(result.answer) == result.answer
    assert not [d for d in deltas if d[0] == "reasoning"]  # not asked for
    if result.path in ("large", "transfer", "small", "large_reasoning") and policy not in ("mutual", "confidence"):
        assert text == result.answer  # the final stage streamed all of it


async def test_reasoning_streams_first_when_asked_on_a_transfer_path():
    p, _ = pipeline()
    result, deltas = await streamed(p, "always", stream_reasoning=True)
    kinds = [k for k, _ in deltas]
    assert kinds.index("content") > max(i for i, k in enumerate(kinds) if k == "reasoning")
    assert "".join(t for k, t in deltas if k == "reasoning") == REASONING
    assert result.tokens["small_reasoning"] == len(REASONING.split())


async def test_mutual_streams_its_speculative_reasoning_only_if_it_transfers():
    agree, _ = pipeline(small="A", large="A", policy={"speculative": True})
    result, deltas = await streamed(agree, "mutual", stream_reasoning=True)
    assert result.path == "agree" and deltas == []
    differ, _ = pipeline(small="A", large="B", policy={"speculative": True})
    result, deltas = await streamed(differ, "mutual", stream_reasoning=True)
    assert result.path == "transfer"
    assert "".join(t for k, t in deltas if k == "reasoning") == REASONING


async def test_a_short_request_is_not_held_behind_a_long_one():
    engine = FakeEngine("large", lambda prompt: " ".join(["w"] * 200) if "long" in prompt else "a b c d e f g h",
                        step_s=0.01)
    long = asyncio.ensure_future(collect(engine.stream(
        GenerationRequest("long", [], SamplingParams(200), request_id="long"))))
    await asyncio.sleep(0.05)
    start = time.perf_counter()
    short = await collect(engine.stream(GenerationRequest("short", [], SamplingParams(8), request_id="short")))
    waited = time.perf_counter() - start
    assert short.completion_tokens == 8 and not long.done()
    assert waited < (10 + 8) * 0.01 + 0.1, waited
    assert short.batch_size == 2
    assert (await long).completion_tokens == 200


class GatedEngine(FakeEngine):
    """A fake whose decoding step waits for `step_go`, and whose prefill of a "late" prompt waits for
    `release`: the test decides what is pending when a step ends."""

    def __init__(self):
        super().__init__("large", lambda prompt: "a")
        self.in_step, self.step_go, self.release = threading.Event(), threading.Event(), threading.Event()

    def prefill(self, requests, prepared):
        if any("late" in r.prompt for r in requests):
            assert self.release.wait(10)
        return super().prefill(requests, prepared)

    def advance(self, state, token_ids):
        self.in_step.set()
        assert self.step_go.wait(10)
        super().advance(state, token_ids)


def test_a_finished_row_is_answered_before_the_next_joiners_prefill():
    engine, events = GatedEngine(), queue.Queue()
    engine.loop.submit(GenerationRequest("first", [], SamplingParams(8), request_id="first"), events.put)
    try:
        assert engine.in_step.wait(5)  # "first" has its one word and is in the step that yields its stop
        late = engine.loop.submit(GenerationRequest("late", [], SamplingParams(8), request_id="late"), lambda e: None)
        engine.step_go.set()
        outputs = []
        while not outputs:
            event = events.get(timeout=5)  # with the late prefill still held
            outputs += [event] if not isinstance(event, TokenDelta) else []
        assert outputs[0].text == "a" and outputs[0].finish_reason == "stop"
        assert not late.done
    finally:
        engine.release.set()


async def test_mutual_agreement_stops_the_speculative_reasoning_within_a_few_steps():
    p, engines = pipeline(small="A", large="A", step_s=0.01, policy={"speculative": True},
                          limits={"reasoning_max_tokens": 200})
    engines["small"].rule = lambda prompt: " ".join(["r"] * 300) if prompt.endswith("<think>\n") else "A"
    result = await p.answer(AskRequest(question="Q?", images=[make_png(0)], policy="mutual", request_id="m1"))
    assert result.path == "agree"
    await asyncio.sleep(0.2)
    decoded = engines["small"].decoded_tokens("m1")
    # small_direct (1 token + stop) and a few reasoning steps, not 200
    assert decoded <= 2 + 5, decoded
