"""Parsing client requests: every bad input is refused with the right status before any model runs,
and good ones become exactly the AskRequest the pipeline expects."""

import base64
import json

import pytest

from tandem.config import load_tandem_config
from tandem.errors import BadRequest, NotFound, PayloadTooLarge
from tandem.openai_api import AnswerStream, answer_pieces, chat_completion, parse_chat_request, stream_rest
from tandem.schemas import TandemResult

from tests.conftest import make_png

CFG = load_tandem_config({"http": {"max_images": 2, "max_image_pixels": 100 * 100}, "limits": {"max_request_tokens": 64}})


def url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def body(**kw) -> bytes:
    data = {"model": "tandem", "messages": [{"role": "user", "content": "hi"}], **kw}
    return json.dumps(data).encode()


def test_good_request_with_images_and_turns():
    img = make_png(0)
    chat = parse_chat_request(body(model="tandem:always", max_tokens=5, temperature=0.5, stream=True, messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url(img)}},
                                     {"type": "text", "text": "How many?"}]}]), CFG)
    assert chat.ask.images == [img] and chat.ask.policy == "always" and chat.stream
    assert chat.ask.question == "system: Be brief.\nHow many?"
    assert (chat.ask.max_tokens, chat.ask.temperature) == (5, 0.5)


@pytest.mark.parametrize("raw, error, fragment", [
    (b"\xff\xfe", BadRequest, "not valid JSON"),
    (body(model=3), BadRequest, "'model'"),
    (body(model="tandem:x"), NotFound, "tandem:x"),
    (body(messages="hi"), BadRequest, "non-empty list"),
    (body(messages=[{"role": "user", "content": []}]), BadRequest, "content"),
    (body(messages=[{"role": "user", "content": [{"type": "audio"}]}]), BadRequest, "'audio'"),
    (body(messages=[{"role": "user", "content": "   "}]), BadRequest, "no text"),
    (body(max_tokens=0), BadRequest, "max_tokens"), (body(max_tokens=65), BadRequest, "max_tokens"),
    (body(max_tokens=True), BadRequest, "max_tokens"), (body(temperature=3), BadRequest, "temperature"),
    (body(temperature="hot"), BadRequest, "temperature"), (body(stream="yes"), BadRequest, "stream"),
    (body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url(make_png(0))}}] * 3
                     + [{"type": "text", "text": "q"}]}]), BadRequest, "too many images"),
    (body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url(make_png(0, 200, 200))}},
                                                 {"type": "text", "text": "q"}]}]), PayloadTooLarge, "pixels"),
    (body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}},
                                                 {"type": "text", "text": "q"}]}]), BadRequest, "base64"),
    (body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "/etc/passwd"}},
                                                 {"type": "text", "text": "q"}]}]), BadRequest, "refused"),
])
def test_bad_requests(raw, error, fragment):
    with pytest.raises(error, match=fragment):
        parse_chat_request(raw, CFG)


def test_responses_carry_usage_trace_and_reassembling_stream():
    chat = parse_chat_request(body(), CFG, request_id="r1")
    result = TandemResult(answer="four legs  here", policy="mutual", path="agree", decision=None,
                          latency_ms={"total": 1.0}, tokens={"large_direct": 3, "small_reasoning": 5},
                          transferred_tokens=0, prompt_tokens=10, completion_tokens=8, images_encoded={})
    full = chat_completion(result, chat)
    assert full["usage"] == {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18,
                             "prompt_tokens_details": {"cached_tokens": 0},
                             "completion_tokens_details": {"reasoning_tokens": 5}}
    assert full["tandem"]["path"] == "agree" and full["id"] == "r1"
    chunks = stream_rest(result, chat, 0, answer_pieces(result.answer))
    assert chunks[-1] == "data: [DONE]\n\n"
    deltas = [json.loads(c[6:])["choices"][0]["delta"].get("content", "") for c in chunks[:-1]]
    assert "".join(deltas) == result.answer


def test_answer_stream_shows_exactly_the_stripped_answer():
    text = "  four legs  here \n"
    for cut in ([text], list(text), ["  four", " legs ", " ", "here", " \n"]):
        stream = AnswerStream()
        shown = "".join(stream.feed(piece) for piece in cut)
        assert shown + stream.rest(text.strip()) == text.strip()
        assert shown == text.strip()  # trailing whitespace is never sent


def test_tandem_options_ride_in_the_body():
    assert parse_chat_request(body(tandem={"stream_reasoning": True}), CFG).ask.stream_reasoning is True
    assert parse_chat_request(body(), CFG).ask.stream_reasoning is False
    for bad, fragment in (({"stream_reasoning": "yes"}, "must be a boolean"), ({"verbose": True}, "unknown"),
                          ([1], "must be an object")):
        with pytest.raises(BadRequest, match=fragment) as err:
            parse_chat_request(body(tandem=bad), CFG)
        assert err.value.status == 400


@pytest.mark.parametrize("field, value", [("n", 2), ("top_p", 0.9), ("seed", 7), ("stop", ["\n"]), ("stop", "x"),
                                          ("presence_penalty", 0.5), ("logprobs", True), ("tools", [{"type": "function"}]),
                                          ("response_format", {"type": "json_object"}), ("n", True),
                                          ("audio", {"voice": "alloy", "format": "wav"}), ("modalities", ["text", "audio"]),
                                          ("functions", [{"name": "f"}])])
def test_unsupported_sampling_fields_are_refused_not_ignored(field, value):
    with pytest.raises(BadRequest, match=f"'{field}' is not supported") as err:
        parse_chat_request(body(**{field: value}), CFG)
    assert err.value.param == field and err.value.status == 400


@pytest.mark.parametrize("field, value", [("n", 1), ("top_p", 1), ("top_p", 1.0), ("seed", None), ("stop", None),
                                          ("stop", []), ("logprobs", False), ("presence_penalty", 0)])
def test_their_defaults_are_accepted(field, value):
    assert parse_chat_request(body(**{field: value}), CFG).ask.question == "hi"


@pytest.mark.parametrize("raw, fragment", [
    (b"[" * 50000 + b"]" * 50000, "nests deeper than"),
    (b'{"model": "tandem", "messages": [{"role": "user", "content": ' + b"[" * 5000 + b"]" * 5000 + b"}]}",
     "nests deeper than"),
])
def test_deep_nesting_is_a_400_not_a_recursion_error(raw, fragment):
    with pytest.raises(BadRequest, match=fragment) as err:
        parse_chat_request(raw, CFG)
    assert err.value.status == 400


def test_lone_surrogates_are_refused_saying_where():
    raw = b'{"model": "tandem", "messages": [{"role": "user", "content": "hi \\ud800 there"}]}'
    with pytest.raises(BadRequest, match=r"messages\[0\]\.content\[0\]\.text is not valid Unicode: a lone UTF-16 "
                                         r"surrogate at character 3") as err:
        parse_chat_request(raw, CFG)
    assert err.value.status == 400 and err.value.param == "messages"
    raw = b'{"model": "tandem", "messages": [{"role": "user", "content": [{"type": "text", "text": "ok"}, ' \
          b'{"type": "text", "text": "a\\udfffb"}]}]}'
    with pytest.raises(BadRequest, match=r"content\[1\]\.text is not valid Unicode"):
        parse_chat_request(raw, CFG)
    raw = b'{"model": "tandem", "messages": [{"role": "user", "content": "caf\\u00e9 \\ud83d\\ude00"}]}'
    assert parse_chat_request(raw, CFG).ask.question == "caf\u00e9 \U0001F600"  # a surrogate *pair* is fine


def test_a_megabyte_model_name_is_malformed_input():
    with pytest.raises(BadRequest, match="'model' is over 256 characters") as err:
        parse_chat_request(body(model="x" * 2**20), CFG)
    assert err.value.status == 400 and len(err.value.message) < 200
    with pytest.raises(NotFound, match="does not exist"):
        parse_chat_request(body(model="tandem:" + "x" * 200), CFG)  # long but plausible: unknown


def test_echoed_values_are_cut_short():
    for data in ({"model": "x" * 10**6}, {"max_tokens": "9" * 10**5}, {"n": [[["deep"] * 1000]] * 1000},
                 {"messages": [{"role": "r" * 10**5, "content": "x"}]}):
        with pytest.raises((BadRequest, NotFound)) as err:
            parse_chat_request(body(**data), CFG)
        assert len(err.value.message) < 300, err.value.message[:100]
        err.value.message.encode("ascii")  # lone surrogates and the like are escaped
