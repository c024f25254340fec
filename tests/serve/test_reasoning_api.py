"""The reasoning API through real Serve, as two kinds of client read it: the official `openai` client
(reasoning in `model_extra`, usage in its own final chunk with `stream_options`) and a vLLM-style
client that reads `delta.reasoning` from the raw SSE stream."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import make_png
from tests.serve.test_app import client, messages

pytestmark = pytest.mark.serve


def test_the_openai_client_gets_usage_in_one_final_chunk_with_include_usage(serve_url):
    chunks = list(client(serve_url).chat.completions.create(
        model="tandem:always", messages=messages("How many legs?", make_png(31)), max_tokens=6, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(ch.usage is None for ch in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason and chunks[-2].model_extra["tandem"]["path"] == "transfer"


def test_a_vllm_style_client_reads_delta_reasoning_then_content(serve_url):
    body = {"model": "tandem:always", "max_tokens": 6, "stream": True, "tandem": {"stream_reasoning": True},
            "messages": [{"role": "user", "content": "How many legs?"}]}
    reasoning, content, older = "", "", ""
    with httpx.stream("POST", f"{serve_url}/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: "):])
            for choice in chunk["choices"]:
                delta = choice["delta"]
                assert not (delta.get("reasoning") and content)  # reasoning comes first
                reasoning += delta.get("reasoning") or ""
                older += delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
    assert reasoning and reasoning == older and content


@pytest.mark.parametrize("effort", ["low", "high"])
def test_reasoning_effort_and_return_reasoning_through_the_openai_client(serve_url, effort):
    out = client(serve_url).chat.completions.create(
        model="tandem:always", messages=messages("How many legs?"), max_tokens=4, reasoning_effort=effort,
        extra_body={"tandem": {"return_reasoning": True}})
    trace = out.model_extra["tandem"]
    applied = trace["reasoning_effort"]
    assert applied["effort"] == effort and trace["tokens"]["small_reasoning"] <= applied["reasoning_max_tokens"]
    assert out.choices[0].message.model_extra["reasoning"]  # the whole reasoning of the transfer path
    assert out.usage.completion_tokens_details.reasoning_tokens == trace["tokens"]["small_reasoning"]


def test_no_reasoning_effort_answers_with_the_large_model_directly(serve_url):
    out = client(serve_url).chat.completions.create(
        model="tandem:always", messages=messages("How many legs?"), max_tokens=4, reasoning_effort="minimal")
    trace = out.model_extra["tandem"]
    assert trace["path"] == "large" and trace["reasoning_effort"]["policy"] == "large"
    assert out.usage.completion_tokens_details.reasoning_tokens == 0


def test_thinking_token_budget_caps_the_reasoning(serve_url):
    out = client(serve_url).chat.completions.create(
        model="tandem:always", messages=messages("How many legs?"), max_tokens=4,
        extra_body={"thinking_token_budget": 3})
    assert 0 < out.model_extra["tandem"]["tokens"]["small_reasoning"] <= 3
