"""Property-based fuzzing of the request parser (hypothesis): whatever a client sends — any JSON
value, chat-shaped bodies with random types at every field, random bytes, data URLs over broken or
hostile image bytes, real images of any size and aspect ratio, floats across their whole range in
every numeric field, control tokens nested in text — parsing either gives a request or raises a
TandemError with a 4xx status and a short message of our own. Never another exception (which the
router would turn into a 500), and no message carrying a traceback, a repr, a path or an address."""

from __future__ import annotations

import base64
import io
import json
import re
import struct
import zlib

from hypothesis import HealthCheck, example, given, settings, strategies as st

from PIL import Image

from tandem.config import load_tandem_config
from tandem.errors import TandemError
from tandem.openai_api import parse_chat_request

CFG = load_tandem_config({"http": {"max_images": 3, "max_image_pixels": 512 * 512, "max_image_bytes": 200_000}})
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30)
json_values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                             max_size=4), max_leaves=30)


def png_header(width: int, height: int) -> bytes:
    """A PNG signature and IHDR claiming these dimensions, then a truncated IDAT."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk + b"\x00\x00\x00\x10IDAT" + b"\x78\x9c" + b"\x00" * 6


image_bytes = st.one_of(
    st.binary(max_size=200),
    st.builds(png_header, st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1)),
    st.builds(lambda b, n: b[:n], st.just(png_header(8, 8)), st.integers(0, 40)),
)
data_urls = st.builds(lambda mime, data: f"data:{mime};base64," + base64.b64encode(data).decode(),
                      st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/svg+xml", "text/plain", "x/y"]),
                      image_bytes) | st.text(max_size=40)
parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=40) | scalars}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": data_urls}) | scalars}),
    st.dictionaries(st.sampled_from(["type", "text", "image_url", "x"]), json_values, max_size=3),
    json_values,
)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool"]) | scalars,
                                           "content": st.text(max_size=40) | st.lists(parts, max_size=4) | scalars}),
                    max_size=3) | json_values
bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(["tandem", "tandem:large", "tandem:nope", ""]) | scalars, "messages": messages},
    optional={"max_tokens": scalars, "temperature": scalars, "stream": scalars, "n": scalars, "stop": json_values,
              "top_p": scalars, "seed": scalars, "logprobs": scalars, "tandem": json_values, "tools": json_values},
)


LEAKS = re.compile(r"Traceback|File \"|object at 0x|/work/|/tmp/|\.py\b|\b\d{1,3}(\.\d{1,3}){3}\b")


def check(raw: bytes) -> None:
    try:
        chat = parse_chat_request(raw, CFG)
    except TandemError as err:
        assert 400 <= err.status < 500, (err.status, err.message)
        assert len(err.message) < 400 and err.message.encode("ascii", "backslashreplace")
        assert not LEAKS.search(err.message), err.message
        json.dumps(err.to_openai())  # always serialisable as OpenAI's error JSON
        return
    assert isinstance(chat.ask.question, str) and chat.ask.question.strip()
    chat.ask.question.encode("utf-8")  # no lone surrogate reaches a tokenizer


@FUZZ
@given(json_values)
def test_any_json_value(value):
    check(json.dumps(value).encode())


@FUZZ
@given(bodies)
@example({"model": "tandem", "messages": [{"role": "user", "content": "hi \ud800 there"}]})
@example({"model": "tandem", "messages": [{"role": "user", "content": [{"type": "image_url",
                                                                        "image_url": {"url": "data:image/png;base64,"}}]}]})
def test_chat_shaped_bodies_with_random_types(body):
    check(json.dumps(body).encode())


@FUZZ
@given(st.binary(max_size=300))
@example(b"[" * 50000 + b"]" * 50000)
@example(b'{"model": "tandem", "messages": "' + b"\xff" * 10 + b'"}')
def test_random_bytes(raw):
    check(raw)


@FUZZ
@given(st.lists(data_urls, min_size=1, max_size=3), st.text(min_size=1, max_size=20))
def test_images_from_hostile_data_urls(urls, text):
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [{"type": "text", "text": text}]
    check(json.dumps({"model": "tandem", "messages": [{"role": "user", "content": content}]}).encode())


def png_of(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), "green").save(buf, "PNG")
    return buf.getvalue()


real_images = st.builds(png_of, st.integers(1, 700), st.integers(1, 700)) | \
    st.builds(lambda n, tall: png_of(1, n) if tall else png_of(n, 1), st.integers(1, 2000), st.booleans())
any_float = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([5e-324, 1e-300, -0.0, 1.7976931348623157e308])
_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|image_pad|>", "<|vision_start|>", "<think>", "</think>"]
nested_text = st.lists(st.sampled_from(_SPECIALS + [s[:3] for s in _SPECIALS] + [s[3:] for s in _SPECIALS] + ["a", " "]),
                       min_size=1, max_size=12).map("".join)


def image_body(image: bytes, text: str, **numbers) -> dict:
    content = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(image).decode()}},
               {"type": "text", "text": text}]
    return {"model": "tandem", "messages": [{"role": "user", "content": content}], **numbers}


@FUZZ
@given(real_images, nested_text)
def test_real_images_of_any_size_and_aspect_ratio(image, text):
    check(json.dumps(image_body(image, text)).encode())


@FUZZ
@given(st.sampled_from(["max_tokens", "max_completion_tokens", "temperature", "top_p", "n"]), any_float,
       st.sampled_from(["reasoning_max_tokens", "latency_budget_ms"]), any_float)
def test_floats_across_their_range_in_every_numeric_field(field, value, option, option_value):
    body = {"model": "tandem:confidence@0.5", "messages": [{"role": "user", "content": "hi"}]}
    check(json.dumps({**body, field: value}).encode())
    check(json.dumps({**body, "tandem": {option: option_value}}).encode())
    check(json.dumps({**body, "model": f"tandem:confidence@{value!r}"}).encode())
