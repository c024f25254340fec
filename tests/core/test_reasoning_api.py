"""The reasoning API as clients of reasoning models expect it: `reasoning_effort` mapped to Tandem's
own budget, `thinking_token_budget` as vLLM names it, `reasoning` (and `reasoning_content`) in the
stream, the whole reasoning in `message.reasoning` when asked, and `stream_options.include_usage`."""

from __future__ import annotations

import json

import pytest

from tandem.config import load_tandem_config
from tandem.engines.fake import FakeEngine
from tandem.errors import BadRequest
from tandem.local import local_stages
from tandem.openai_api import chat_completion, parse_chat_request, stream_delta, stream_rest
from tandem.pipeline import Pipeline

CFG = load_tandem_config({"limits": {"reasoning_max_tokens": 64}})


def body(**kw) -> bytes:
    return json.dumps({"model": "tandem:always", "messages": [{"role": "user", "content": "How many?"}],
                       **kw}).encode()


@pytest.mark.parametrize("effort, budget", [("low", 16), ("medium", 32), ("high", 64), ("xhigh", 64)])
def test_an_effort_sets_its_share_of_the_reasoning_limit(effort, budget):
    chat = parse_chat_request(body(reasoning_effort=effort), CFG)
    assert chat.ask.reasoning_max_tokens == budget and chat.ask.policy == "always"
    assert chat.ask.reasoning_effort == {"effort": effort, "reasoning_max_tokens": budget}


@pytest.mark.parametrize("effort", ["none", "minimal"])
def test_no_effort_means_no_reasoning_whatever_the_policy(effort):
    chat = parse_chat_request(body(reasoning_effort=effort, model="tandem:confidence@0.3"), CFG)
    assert (chat.ask.policy, chat.ask.policy_param, chat.ask.reasoning_max_tokens) == ("large", None, None)
    assert chat.ask.reasoning_effort == {"effort": effort, "reasoning_max_tokens": 0, "policy": "large"}


def test_a_token_budget_beside_an_effort_caps_it():
    chat = parse_chat_request(body(reasoning_effort="high", tandem={"reasoning_max_tokens": 10}), CFG)
    assert chat.ask.reasoning_max_tokens == 10


def test_an_unknown_effort_is_a_400_naming_it():
    with pytest.raises(BadRequest, match="'reasoning_effort' must be one of") as err:
        parse_chat_request(body(reasoning_effort="max"), CFG)
    assert err.value.param == "reasoning_effort"


def test_thinking_token_budget_is_reasoning_max_tokens_with_its_bounds():
    assert parse_chat_request(body(thinking_token_budget=20), CFG).ask.reasoning_max_tokens == 20
    with pytest.raises(BadRequest, match="'thinking_token_budget' must be an integer from 1 to 64") as err:
        parse_chat_request(body(thinking_token_budget=65), CFG)
    assert err.value.param == "thinking_token_budget"
    with pytest.raises(BadRequest, match="not both"):
        parse_chat_request(body(thinking_token_budget=20, tandem={"reasoning_max_tokens": 20}), CFG)


def test_stream_options_need_a_stream_and_a_boolean():
    assert parse_chat_request(body(stream=True, stream_options={"include_usage": True}), CFG).include_usage
    assert not parse_chat_request(body(stream=True, stream_options={}), CFG).include_usage
    with pytest.raises(BadRequest, match="only allowed when 'stream' is true"):
        parse_chat_request(body(stream_options={"include_usage": True}), CFG)
    with pytest.raises(BadRequest, match="include_usage"):
        parse_chat_request(body(stream=True, stream_options={"include_usage": "yes"}), CFG)


def pipeline() -> Pipeline:
    engines = {role: FakeEngine(role, step_s=0.0) for role in ("small", "large")}
    return Pipeline(CFG, local_stages(engines))


async def answer(raw: bytes):
    chat = parse_chat_request(raw, CFG)
    return chat, await pipeline().answer(chat.ask)


async def test_reasoning_tokens_rise_from_low_to_high_on_the_same_request():
    tokens = {}
    for effort in ("minimal", "low", "medium", "high"):
        chat, result = await answer(body(reasoning_effort=effort))
        tokens[effort] = chat_completion(result, chat)["usage"]["completion_tokens_details"]["reasoning_tokens"]
        assert result.trace()["reasoning_effort"]["effort"] == effort
    assert tokens["minimal"] == 0 < tokens["low"] < tokens["medium"] < tokens["high"] <= 64, tokens


async def test_the_whole_reasoning_is_returned_when_asked_and_only_then():
    chat, result = await answer(body(tandem={"return_reasoning": True}))
    message = chat_completion(result, chat)["choices"][0]["message"]
    assert message["reasoning"] == result.reasoning and len(message["reasoning"].split()) == 64
    assert result.reasoning.startswith(result.reasoning_excerpt.split(" ")[0])
    chat, result = await answer(body())
    assert "reasoning" not in chat_completion(result, chat)["choices"][0]["message"]
    chat, result = await answer(body(model="tandem:large", tandem={"return_reasoning": True}))
    assert chat_completion(result, chat)["choices"][0]["message"]["reasoning"] is None  # no reasoning on its path


def chunks_of(sse: list[str]) -> list[dict]:
    return [json.loads(c[len("data: "):]) for c in sse if c.startswith("data: {")]


async def test_reasoning_streams_as_reasoning_and_reasoning_content():
    chat = parse_chat_request(body(stream=True), CFG)
    [chunk] = chunks_of([stream_delta(chat, 0, "reasoning", "step1 ")])
    assert chunk["choices"][0]["delta"] == {"reasoning": "step1 ", "reasoning_content": "step1 "}


async def test_include_usage_adds_exactly_one_final_chunk_with_usage_and_empty_choices():
    chat, result = await answer(body(stream=True, stream_options={"include_usage": True}))
    sse = [stream_delta(chat, 0, "content", "A")] + stream_rest(result, chat, 0, [])
    chunks = chunks_of(sse)
    assert sse[-1] == "data: [DONE]\n\n"
    assert [c["usage"] is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == result.completion_tokens
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and "tandem" in chunks[-2]
    chat, result = await answer(body(stream=True))
    plain = chunks_of(stream_rest(result, chat, 0, []))
    assert plain[-1]["choices"] and plain[-1]["usage"] and "usage" not in chunks_of([stream_delta(chat, 0, "content", "A")])[0]
