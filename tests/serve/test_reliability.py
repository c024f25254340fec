"""Hostile input, overload and faults against the running app (real Serve, real tiny models): every
bad request gets the right 4xx in OpenAI's shape and the next good one is answered; overload is a
fast 503 with Retry-After; a killed replica is replaced and no request of the burst hangs; a client
that leaves a stream cancels the generation downstream."""

from __future__ import annotations

import base64
import io
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from PIL import Image

from tests.conftest import make_png
from tests.serve.conftest import API_KEY, handle

pytestmark = pytest.mark.serve


def _png_of(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def _url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _with_image(url: str, text: str = "what is it?") -> dict:
    return {"model": "tandem:large", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}]}


def _chat(**kw) -> dict:
    return {"model": "tandem:large", "messages": [{"role": "user", "content": "hi"}], **kw}


def _msgs(messages) -> dict:
    return {"model": "tandem:large", "messages": messages}


BOMB = _png_of(Image.new("1", (20000, 20000)))  # 48 KB of file, 400 M pixels once decoded
HUGE = _png_of(Image.new("1", (5000, 4000)))  # 20 M pixels: over the 16.7 M limit
OVERSIZED = b"\x89PNG\r\n\x1a\n" + os.urandom(9 * 2**20)  # over the 8 MiB image limit
GOOD = make_png(20)

BAD_REQUESTS = [
    ("malformed json", b"{not json", 400, "not valid JSON"),
    ("empty body", b"", 400, "not valid JSON"),
    ("json array", b"[1, 2]", 400, "JSON object"),
    ("json string", b'"hello"', 400, "JSON object"),
    ("model missing", {"messages": [{"role": "user", "content": "hi"}]}, 400, "'model'"),
    ("model not a string", _chat(model=7), 400, "'model'"),
    ("unknown model", _chat(model="gpt-4o"), 404, "does not exist"),
    ("unknown policy", _chat(model="tandem:fastest"), 404, "tandem:fastest"),
    ("messages missing", {"model": "tandem"}, 400, "'messages'"),
    ("messages empty", _msgs([]), 400, "'messages'"),
    ("messages an object", _msgs({"role": "user"}), 400, "'messages'"),
    ("message not an object", _msgs(["hi"]), 400, "messages[0] must be an object"),
    ("unknown role", _msgs([{"role": "wizard", "content": "hi"}]), 400, "role"),
    ("content missing", _msgs([{"role": "user"}]), 400, "content"),
    ("content empty list", _msgs([{"role": "user", "content": []}]), 400, "content"),
    ("content a number", _msgs([{"role": "user", "content": 42}]), 400, "content"),
    ("unknown part type", _msgs([{"role": "user", "content": [{"type": "input_audio"}]}]), 400, "input_audio"),
    ("text part without text", _msgs([{"role": "user", "content": [{"type": "text", "text": 3}]}]), 400,
     "content[0]"),
    ("image part without url", _msgs([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     400, "image_url.url"),
    ("only whitespace", _msgs([{"role": "user", "content": "   "}]), 400, "no text"),
    ("not an image", _with_image(_url(b"hello, world")), 400, "could not be decoded"),
    ("truncated image", _with_image(_url(GOOD[:300])), 400, "could not be decoded"),
    ("decompression bomb", _with_image(_url(BOMB)), 413, "pixels"),
    ("image over pixel limit", _with_image(_url(HUGE)), 413, "pixels"),
    ("image over byte limit", _with_image(_url(OVERSIZED)), 413, "bytes"),
    ("svg image", _with_image(_url(b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml")), 400,
     "could not be decoded"),
    ("non-image data url", _with_image(_url(b"hi", "text/plain")), 400, "refused"),
    ("bad base64", _with_image("data:image/png;base64,!!!notbase64"), 400, "base64"),
    ("file url", _with_image("file:///etc/passwd"), 400, "refused"),
    ("local path", _with_image("/etc/passwd"), 400, "refused"),
    ("remote url", _with_image("http://example.com/cat.png"), 400, "refused"),
    ("metadata url", _with_image("http://169.254.169.254/latest/meta-data"), 400, "refused"),
    ("too many images", {"model": "tandem:large", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _url(GOOD)}}] * 5 + [{"type": "text", "text": "q"}]}]},
     400, "too many images"),
    ("max_tokens zero", _chat(max_tokens=0), 400, "max_tokens"),
    ("max_tokens huge", _chat(max_tokens=10**9), 400, "max_tokens"),
    ("max_tokens a string", _chat(max_tokens="10"), 400, "max_tokens"),
    ("temperature negative", _chat(temperature=-1), 400, "temperature"),
    ("temperature a string", _chat(temperature="warm"), 400, "temperature"),
    ("stream not a boolean", _chat(stream="yes"), 400, "stream"),
    ("text over the character limit", _msgs([{"role": "user", "content": "x" * 9000}]), 413, "characters"),
    # Within the 3,000-character limit, but each CJK character is several byte-level tokens: 8,997 > 4,096.
    ("prompt over the token limit", _msgs([{"role": "user", "content": "漢" * 2999}]), 400, "tokens"),
    ("body over the limit", b"{" + b" " * (17 * 2**20) + b"}", 413, "limit"),
    ("50,000 nested arrays", b"[" * 50000 + b"]" * 50000, 400, "nests deeper than"),
    ("5,000 nested arrays in content", b'{"model": "tandem", "messages": [{"role": "user", "content": '
     + b"[" * 5000 + b"]" * 5000 + b"}]}", 400, "nests deeper than"),
    ("lone surrogate", _msgs([{"role": "user", "content": "hi \ud800 there"}]), 400, "not valid Unicode"),
    ("1 MB model name", _chat(model="x" * 2**20), 400, "'model' is over 256 characters"),
    ("tools", _chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "'tools' is not supported"),
    ("n of 3", _chat(n=3), 400, "'n' is not supported"),
    ("stop", _chat(stop=["\n"]), 400, "'stop' is not supported"),
]


def _post(url: str, body, headers=None, timeout=60) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}/v1/chat/completions", content=content, timeout=timeout,
                      headers={"Content-Type": "application/json", **(headers or {})})


def test_the_table_covers_at_least_thirty_cases():
    assert len(BAD_REQUESTS) >= 30


@pytest.mark.parametrize("name, body, status, fragment", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_input_gets_a_clear_4xx_and_the_next_request_is_answered(serve_url, name, body, status, fragment):
    r = _post(serve_url, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert fragment in error["message"] and error["code"] == status and error["type"]
    assert len(error["message"]) < 400  # nothing a client sent is echoed back whole
    good = _post(serve_url, {"model": "tandem:large", "max_tokens": 2,
                             "messages": [{"role": "user", "content": [
                                 {"type": "image_url", "image_url": {"url": _url(GOOD)}},
                                 {"type": "text", "text": "still there?"}]}]})
    assert good.status_code == 200 and good.json()["tandem"]["path"] == "large"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY},
                                     {"Authorization": f"Basic {API_KEY}"}])
def test_api_keys_gate_requests_but_not_health(serve_url, headers):
    agree = f"{serve_url}/agree"
    r = _post(agree, _chat(max_tokens=2), headers)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert httpx.get(f"{agree}/v1/models", headers=headers).status_code == 401
    assert httpx.get(f"{agree}/healthz").status_code == 200
    ok = _post(agree, _chat(max_tokens=2), {"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200


def test_overload_is_a_fast_503_with_retry_after(serve_url):
    """The agree app's LargeAnswerer takes one request and queues one (and its Router admits four): a
    burst must be shed quickly, not queued without bound."""
    agree, auth = f"{serve_url}/agree", {"Authorization": f"Bearer {API_KEY}"}

    def one(i):
        start = time.monotonic()
        r = _post(agree, {"model": "tandem:large_reasoning", "max_tokens": 4,
                          "messages": [{"role": "user", "content": f"overload {i}?"}]}, auth)
        return r, time.monotonic() - start

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(one, range(10)))
    rejected = [(r, s) for r, s in results if r.status_code == 503]
    assert {r.status_code for r, _ in results} <= {200, 503}
    assert rejected and any(r.status_code == 200 for r, _ in results)
    for r, seconds in rejected:
        assert r.headers.get("Retry-After", "").isdigit() and r.json()["error"]["type"] == "overloaded_error"
        assert seconds < 5
    assert _post(agree, _chat(max_tokens=2), auth).status_code == 200


def test_the_admission_limit_turns_a_burst_away_at_the_door_and_frees_every_slot(serve_url):
    """The agree app's Router admits 4 chat requests at a time (http.max_in_flight): a burst of 12 —
    half of them streams, one stream left after its first event — never has more than 4 in flight;
    the rest get 503 overloaded_error naming the limit, at once; health answers meanwhile; and when the
    burst is over every slot is back (streams and abandoned streams included)."""
    agree, auth = f"{serve_url}/agree", {"Authorization": f"Bearer {API_KEY}"}
    router = handle("Router", "agree")
    rejected_before = router.stats.remote().result()["rejected"]
    start = threading.Barrier(13)

    def one(i):
        body = {"model": "tandem:large_reasoning", "max_tokens": 32, "stream": i % 2 == 1,
                "messages": [{"role": "user", "content": f"admission {i}?"}]}
        start.wait()
        t0 = time.monotonic()
        if i == 1:  # a client that leaves its stream after the first event
            with httpx.stream("POST", f"{agree}/v1/chat/completions", json=body, headers=auth, timeout=60) as r:
                if r.status_code == 200:
                    next(r.iter_lines())
                    return 200, "left", time.monotonic() - t0
                r.read()
                return r.status_code, r.json(), time.monotonic() - t0
        r = _post(agree, body, auth)
        return r.status_code, r.json() if r.status_code != 200 else r.text, time.monotonic() - t0

    def health():
        start.wait()
        return httpx.get(f"{agree}/healthz", timeout=10).status_code

    with ThreadPoolExecutor(13) as pool:
        probe = pool.submit(health)
        results = list(pool.map(one, range(12)))
    assert probe.result() == 200
    at_door = [(body, s) for status, body, s in results
               if status == 503 and "max_in_flight" in body["error"]["message"]]
    assert at_door, results
    for body, seconds in at_door:
        assert body["error"]["type"] == "overloaded_error" and seconds < 5
    assert {status for status, _, _ in results} <= {200, 503}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and router.stats.remote().result()["in_flight"]:
        time.sleep(0.1)
    stats = router.stats.remote().result()
    assert stats["in_flight"] == 0 and stats["peak_in_flight"] <= 4
    assert stats["rejected"] - rejected_before >= len(at_door)
    assert _post(agree, _chat(max_tokens=2), auth).status_code == 200


def test_client_leaving_a_stream_cancels_the_generation_downstream(serve_url):
    large = handle("LargeAnswerer")
    stats = large.stats.remote().result()
    before, batches = stats["cancelled"], len(stats["batch_sizes"])
    # Long enough that the disconnect lands mid-generation: 4 tokens once finished before it did.
    body = {"model": "tandem:large_reasoning", "stream": True, "max_tokens": 256,
            "messages": [{"role": "user", "content": "think about it, at length?"}]}
    with httpx.stream("POST", f"{serve_url}/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()  # held: dropping the iterator would close the connection at once
        first = next(lines)
        assert first.startswith("data: ") and '"role": "assistant"' in first
        while len(large.stats.remote().result()["batch_sizes"]) == batches:  # generation under way
            time.sleep(0.02)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and large.stats.remote().result()["cancelled"] == before:
        time.sleep(0.2)
    assert large.stats.remote().result()["cancelled"] > before


def _kill_replica(deployment: str) -> int:
    import ray
    from ray._private.state import actors

    for info in actors(actor_state_name="ALIVE").values():
        if info["ActorClassName"] == f"ServeReplica:tandem:{deployment}":
            ray.kill(ray.get_actor(info["Name"], namespace="serve"), no_restart=True)
            return info["Pid"]
    raise AssertionError(f"no live replica of {deployment}")


@pytest.mark.parametrize("deployment, policy", [("LargeAnswerer", "large"), ("SmallReasoner", "mutual")])
def test_a_replica_killed_during_a_burst_is_replaced_and_no_request_hangs(serve_url, deployment, policy):
    stop, outcomes = threading.Event(), []

    def client(i):
        n = 0
        while not stop.is_set():
            try:
                r = _post(serve_url, {"model": f"tandem:{policy}", "max_tokens": 3,
                                      "messages": [{"role": "user", "content": f"kill {i} {n}?"}]}, timeout=90)
                outcomes.append((r.status_code, r.json().get("tandem", {}).get("degraded")))
            except httpx.TimeoutException:
                outcomes.append(("hang", None))
            n += 1

    old_pid = handle(deployment).stats.remote().result()["pid"]
    with ThreadPoolExecutor(4) as pool:
        for i in range(4):
            pool.submit(client, i)
        time.sleep(1.5)
        assert _kill_replica(deployment) == old_pid
        time.sleep(3)
        stop.set()
    statuses = {s for s, _ in outcomes}
    # A call the dead replica had not answered goes to the replacement: no 500, none hangs.
    assert "hang" not in statuses and statuses <= {200, 503, 504}, outcomes
    assert 200 in statuses
    if deployment == "SmallReasoner":  # the large model answers alone while the small one is down
        assert all(s == 200 for s, _ in outcomes), outcomes
    deadline = time.monotonic() + 120
    new_pid = None
    while time.monotonic() < deadline:
        try:
            new_pid = handle(deployment).stats.remote().result(timeout_s=5)["pid"]
            if new_pid != old_pid:
                break
        except Exception:  # the replacement is still starting
            pass
        time.sleep(1)
    assert new_pid and new_pid != old_pid
    r = _post(serve_url, {"model": f"tandem:{policy}", "max_tokens": 2,
                          "messages": [{"role": "user", "content": "recovered?"}]})
    assert r.status_code == 200 and r.json()["tandem"]["degraded"] is False
