"""Tandem under real Serve with real tiny transformers models, queried as users do: the official
openai client and raw HTTP. Asserts what came back (path, trace, text) and what the deployments
recorded (batch sizes, encodes, replica pids)."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import OpenAI

from tandem.policies import POLICY_NAMES
from tests.conftest import make_png
from tests.serve.conftest import API_KEY, ENGINE, app_configs, deploy, handle

pytestmark = pytest.mark.serve


def image_part(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


def messages(question: str, *images: bytes) -> list[dict]:
    return [{"role": "user", "content": [*(image_part(i) for i in images), {"type": "text", "text": question}]}]


def client(url: str, app: str = "") -> OpenAI:
    return OpenAI(base_url=f"{url}{app}/v1", api_key=API_KEY if app else "unused", max_retries=0, timeout=120)


def trace(completion) -> dict:
    return completion.model_extra["tandem"]


EXPECTED_PATHS = {"large": {"large"}, "small": {"small"}, "large_reasoning": {"large_reasoning"},
                  "always": {"transfer"}, "mutual": {"transfer"}, "confidence": {"large", "transfer"},
                  "random": {"large", "transfer"}, "confidence_mutual": {"agree", "large", "transfer"}}


@pytest.mark.parametrize("policy", sorted(EXPECTED_PATHS))
def test_openai_client_each_policy_takes_its_path(serve_url, policy):
    c = client(serve_url)
    out = c.chat.completions.create(model=f"tandem:{policy}", messages=messages("How many legs?", make_png(10)),
                                    max_tokens=6)
    t = trace(out)
    assert t["policy"] == policy and t["path"] in EXPECTED_PATHS[policy]
    assert out.choices[0].message.role == "assistant" and isinstance(out.choices[0].message.content, str)
    assert out.usage.completion_tokens == sum(t["tokens"].values())
    if t["path"] == "transfer":
        assert t["transferred_tokens"] > 0 and "small_reasoning" in t["tokens"]
    if policy == "confidence":
        assert (t["path"] == "transfer") == (t["decision"]["confidence"] < t["decision"]["threshold"])


def test_model_tandem_uses_the_configured_default(serve_url):
    out = client(serve_url).chat.completions.create(model="tandem", messages=messages("Colour?"), max_tokens=4)
    assert trace(out)["policy"] == "mutual"


def test_stream_reassembles_to_the_non_streamed_text(serve_url):
    c = client(serve_url)
    kwargs = dict(model="tandem:large", messages=messages("What is shown?", make_png(11)), max_tokens=8,
                  temperature=0)
    whole = c.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(c.chat.completions.create(stream=True, **kwargs))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == whole and len(whole) > 0
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].model_extra["tandem"]["path"] == "large"


def test_mutual_agreement_path_when_both_roles_are_the_same_model(serve_url):
    out = client(serve_url, "/agree").chat.completions.create(
        model="tandem:mutual", messages=messages("How many legs?", make_png(12)), max_tokens=6)
    t = trace(out)
    assert (t["path"], t["agreement"]) == ("agree", True)
    assert t["decision"]["small_answer"] == t["decision"]["large_answer"]
    assert "small_reasoning" not in t["tokens"] and t["transferred_tokens"] == 0


def test_mutual_transfer_encodes_each_image_once_per_model(serve_url):
    vision = handle("VisionEncoder")
    before = vision.stats.remote().result()["encoded"]
    out = client(serve_url).chat.completions.create(
        model="tandem:mutual", messages=messages("How many legs?", make_png(13), make_png(14)), max_tokens=6)
    t = trace(out)
    assert t["path"] == "transfer" and t["agreement"] is False
    assert {"large_direct", "large_transfer"} <= set(t["tokens"])  # the large model ran twice
    assert t["images_encoded"] == {"small": 2, "large": 2}
    after = vision.stats.remote().result()["encoded"]
    assert {r: after[r] - before[r] for r in after} == {"small": 2, "large": 2}


@pytest.mark.skipif(ENGINE != "vllm", reason="prefix caching is vLLM's (the transformers engine reuses no prefix)")
def test_a_mutual_transfer_reuses_the_direct_prompts_cached_head(serve_url):
    image = make_png(21, 256, 256)  # 64 visual tokens at the tiny models' geometry
    out = client(serve_url).chat.completions.create(
        model="tandem:mutual", max_tokens=4,
        messages=messages("Look at the grid carefully and say which option is right: A, B, C or D?", image))
    t = trace(out)
    assert t["path"] == "transfer"
    assert t["stages"]["large_transfer"]["cached_tokens"] >= 64
    assert out.usage.prompt_tokens_details.cached_tokens >= t["stages"]["large_transfer"]["cached_tokens"]


def _concurrent(url: str, n: int, tag: str) -> list[dict]:
    def one(i):
        body = {"model": "tandem:large", "max_tokens": 3, "messages": messages(f"{tag} question {i}?")}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_concurrent_requests_reach_the_model_server_in_fewer_batches(serve_url):
    large = handle("LargeAnswerer")
    seen = len(large.stats.remote().result()["batch_sizes"])
    n = 8
    _concurrent(serve_url, n, "batch")
    sizes = large.stats.remote().result()["batch_sizes"][seen:]
    assert sum(sizes) == n
    assert len(sizes) < n and max(sizes) > 1


@pytest.mark.skipif(ENGINE == "vllm", reason="vLLM's batch limit (vllm.max_num_seqs) is fixed when its engine starts")
def test_reconfigure_changes_batch_size_without_restarting_the_replica(serve_url):
    large = handle("LargeAnswerer")
    before = large.stats.remote().result()
    assert before["max_batch_size"] == 8
    try:
        deploy(app_configs(large_batch={"max_batch_size": 2, "batch_wait_timeout_s": 0.05}))
        after = handle("LargeAnswerer").stats.remote().result()
        assert after["max_batch_size"] == 2 and after["pid"] == before["pid"]
        seen = len(after["batch_sizes"])
        _concurrent(serve_url, 6, "reconf")
        sizes = handle("LargeAnswerer").stats.remote().result()["batch_sizes"][seen:]
        assert sum(sizes) == 6 and max(sizes) <= 2
    finally:
        deploy(app_configs())
    assert handle("LargeAnswerer").stats.remote().result()["pid"] == before["pid"]


def test_models_and_health(serve_url):
    assert httpx.get(f"{serve_url}/healthz").json() == {"status": "ok"}
    missing = httpx.get(f"{serve_url}/v2/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    ids = [m.id for m in client(serve_url).models.list().data]
    assert set(ids) == {"tandem"} | {f"tandem:{p}" for p in POLICY_NAMES}


def test_routing_controls_through_the_openai_client(serve_url):
    """A parameter in the model name, and the `tandem` object sent with extra_body: what the router
    did with them is in the trace, and a bad value is a 400 naming it."""
    import openai

    c, msgs = client(serve_url), messages("How many legs?", make_png(11))
    out = c.chat.completions.create(model="tandem:confidence@0.35", messages=msgs, max_tokens=4)
    assert trace(out)["params"] == {"threshold": 0.35} and trace(out)["decision"]["threshold"] == 0.35
    out = c.chat.completions.create(model="tandem:always", messages=msgs, max_tokens=4,
                                    extra_body={"tandem": {"reasoning_max_tokens": 16}})
    assert 0 < trace(out)["tokens"]["small_reasoning"] <= 16 and trace(out)["transferred_tokens"] <= 16
    # The router has now measured every stage of the transfer path: a 1 ms budget leaves no time to reason.
    out = c.chat.completions.create(model="tandem:always", messages=msgs, max_tokens=4,
                                    extra_body={"tandem": {"latency_budget_ms": 1}})
    assert trace(out)["path"] == "large" and trace(out)["budget"]["action"] == "direct"
    assert "small_reasoning" not in trace(out)["tokens"]
    for model, extra, param in (("tandem:confidence@2", None, "model"),
                                ("tandem:always", {"tandem": {"reasoning_max_tokens": 10**6}}, "tandem.reasoning_max_tokens"),
                                ("tandem:always", {"tandem": {"latency_budget_ms": -1}}, "tandem.latency_budget_ms")):
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model=model, messages=msgs, max_tokens=4, extra_body=extra)
        assert err.value.body["param"] == param
