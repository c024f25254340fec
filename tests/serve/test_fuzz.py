"""The parser's fuzz strategies against the served app (fewer examples): whatever the body — random
types, real images of any size and aspect ratio, floats across their range, nested control tokens —
the response is never a 5xx, always OpenAI's error JSON when not 200, never echoes more than a short
prefix nor carries a traceback, a repr, a path or an address, and a good request still answers."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.core.test_fuzz_api import LEAKS, any_float, bodies, image_body, json_values, nested_text, real_images

pytestmark = pytest.mark.serve
SERVED = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


def _post(url: str, raw: bytes) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", content=raw, timeout=60,
                      headers={"Content-Type": "application/json"})


def _assert_clean(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    assert not LEAKS.search(r.text), r.text[:300]
    if r.status_code != 200:
        error = r.json()["error"]
        assert error["code"] == r.status_code and error["type"] and error["message"]
        assert len(error["message"]) < 400


@pytest.fixture(scope="module")
def url(serve_url):
    yield serve_url
    good = {"model": "tandem:large", "max_tokens": 2, "messages": [{"role": "user", "content": "still there?"}]}
    assert _post(serve_url, json.dumps(good).encode()).status_code == 200


@SERVED
@given(body=bodies)
def test_chat_shaped_bodies_never_get_a_5xx(url, body):
    _assert_clean(_post(url, json.dumps(body).encode()))


@SERVED
@given(raw=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_bytes_and_json_values_never_get_a_5xx(url, raw):
    _assert_clean(_post(url, raw))


@SERVED
@given(image=real_images, text=nested_text, temperature=any_float)
def test_real_images_nested_tokens_and_any_temperature_never_get_a_5xx(url, image, text, temperature):
    body = image_body(image, text, model="tandem:mutual", max_tokens=3, temperature=temperature)
    _assert_clean(_post(url, json.dumps(body).encode()))
