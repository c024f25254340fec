"""The OpenAI-compatible surface, as pure functions over bytes and dicts (no web framework here).

Parses and validates a `/v1/chat/completions` body into an AskRequest (images decoded and checked
against the limits, remote URLs refused unless allow-listed, local paths and `file:` always), and
builds the JSON response, the SSE chunks and the model list. The Router adapter only moves bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

from tandem.config import POLICY_NAMES, HttpConfig, TandemConfig
from tandem.errors import BadRequest, NotFound, PayloadTooLarge, TandemError
from tandem.fetch import fetch_image
from tandem.images import decode_image
from tandem.schemas import AskRequest, TandemResult

MODEL_PREFIX = "tandem"
_DATA_URL = re.compile(r"^data:image/[a-zA-Z0-9.+-]+;base64,", re.I)
_ROLES = {"system", "user", "assistant", "developer"}


@dataclass
class ChatRequest:
    ask: AskRequest
    model: str
    stream: bool


def model_ids() -> list[str]:
    return [MODEL_PREFIX] + [f"{MODEL_PREFIX}:{p}" for p in POLICY_NAMES]


def policy_for_model(model: object, default: str) -> str:
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must be a non-empty string", param="model")
    if model == MODEL_PREFIX:
        return default
    name = model.split(":", 1)[1] if model.startswith(MODEL_PREFIX + ":") else None
    if name not in POLICY_NAMES:
        raise NotFound(f"model '{model}' does not exist; available: {', '.join(model_ids())}", param="model")
    return name


def parse_chat_request(body: bytes, config: TandemConfig, request_id: str | None = None) -> ChatRequest:
    http = config.http
    if len(body) > http.max_body_bytes:
        raise PayloadTooLarge(f"request body is {len(body)} bytes; the limit is {http.max_body_bytes}")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadRequest(f"request body is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    policy = policy_for_model(data.get("model"), config.policy.default)
    _refuse_unsupported(data)
    question, images = _parse_messages(data.get("messages"), http)
    options = _tandem_options(data.get("tandem"))
    return ChatRequest(
        ask=AskRequest(question=question, images=images, policy=policy,
                       max_tokens=_max_tokens(data, config), temperature=_temperature(data),
                       request_id=request_id or f"chatcmpl-{uuid.uuid4().hex[:24]}",
                       stream_reasoning=options.get("stream_reasoning", False)),
        model=data["model"], stream=_flag(data, "stream"))


# OpenAI sampling fields Tandem does not implement: refused unless they ask for the default, never
# silently ignored (a client that sets them expects them to act).
_UNSUPPORTED = {
    "n": (1,), "top_p": (1, 1.0), "seed": (), "stop": ([], ""), "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0), "logit_bias": ({},), "logprobs": (False,), "top_logprobs": (0,),
    "tools": ([],), "tool_choice": ("none",), "response_format": ({"type": "text"},),
}
_WHY = {"n": "one choice per request", "top_p": "greedy or plain temperature sampling only",
        "seed": "no seeded sampling", "stop": "stages stop at their own stop strings",
        "logprobs": "no log-probabilities in responses", "top_logprobs": "no log-probabilities in responses",
        "tools": "no tool calls", "tool_choice": "no tool calls", "response_format": "text answers only"}


def _refuse_unsupported(data: dict) -> None:
    for key, defaults in _UNSUPPORTED.items():
        value = data.get(key)
        if value is None or any(value == d and type(value) is type(d) for d in defaults):
            continue
        why = _WHY.get(key, "not implemented")
        raise BadRequest(f"'{key}' is not supported ({why}); omit it or send null"
                         + (f" or {defaults[0]!r}" if defaults else "") + f"; got {value!r}", param=key)


_TANDEM_OPTIONS = ("stream_reasoning",)


def _tandem_options(value: object) -> dict:
    """The body's `tandem` object (the openai client sends it with `extra_body`)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest("'tandem' must be an object", param="tandem")
    unknown = sorted(set(value) - set(_TANDEM_OPTIONS))
    if unknown:
        raise BadRequest(f"unknown 'tandem' option(s) {unknown}; known: {list(_TANDEM_OPTIONS)}", param="tandem")
    return {key: _flag(value, key) for key in value}


def _flag(data: dict, key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be a boolean", param=key)
    return value


def _max_tokens(data: dict, config: TandemConfig) -> int | None:
    value = data.get("max_completion_tokens", data.get("max_tokens"))
    if value is None:
        return None
    limit = config.limits.max_request_tokens
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise BadRequest(f"'max_tokens' must be an integer from 1 to {limit}; got {value!r}", param="max_tokens")
    return value


def _temperature(data: dict) -> float:
    value = data.get("temperature", 0.0)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 2.0:
        raise BadRequest(f"'temperature' must be a number from 0 to 2; got {value!r}", param="temperature")
    return float(value)


def _parse_messages(messages: object, http: HttpConfig) -> tuple[str, list[bytes]]:
    """The conversation as one question text (turns in order) and its images in order."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    texts: list[str] = []
    images: list[bytes] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object", param="messages")
        role = message.get("role")
        if role not in _ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {sorted(_ROLES)}; got {role!r}", param="messages")
        for text in _parse_content(message.get("content"), i, http, images):
            texts.append(text if role == "user" else f"{role}: {text}")
    question = "\n".join(t for t in texts if t.strip())
    if not question.strip():
        raise BadRequest("the messages contain no text", param="messages")
    if len(question) > http.max_question_chars:
        raise PayloadTooLarge(f"message text is {len(question)} characters; the limit is {http.max_question_chars}",
                              param="messages")
    return question, images


def _parse_content(content: object, i: int, http: HttpConfig, images: list[bytes]) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list) or not content:
        raise BadRequest(f"messages[{i}].content must be a string or a non-empty list of parts", param="messages")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            if len(images) >= http.max_images:
                raise BadRequest(f"too many images; the limit is {http.max_images}", param="messages")
            images.append(_load_image(part.get("image_url"), f"messages[{i}].content[{j}]", http))
        else:
            raise BadRequest(f"messages[{i}].content[{j}] must be a text or image_url part; got type {kind!r}",
                             param="messages")
    return texts


def _load_image(image_url: object, where: str, http: HttpConfig) -> bytes:
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if not isinstance(url, str) or not url:
        raise BadRequest(f"{where}.image_url.url must be a string", param="messages")
    if _DATA_URL.match(url):
        payload = url.split(",", 1)[1]
        if len(payload) * 3 // 4 > http.max_image_bytes:
            raise PayloadTooLarge(f"{where}: image is over {http.max_image_bytes} bytes", param="messages")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"{where}: image data URL is not valid base64", param="messages") from None
    elif http.allowed_image_hosts and urlparse(url).scheme.lower() in ("http", "https"):
        try:
            data = fetch_image(url, allowed_hosts=http.allowed_image_hosts, timeout_s=http.image_fetch_timeout_s,
                               max_bytes=http.max_image_bytes)
        except TandemError as err:
            raise type(err)(f"{where}: {err.message}", param="messages") from None
    else:
        raise BadRequest(f"{where}: only base64 data:image/... URLs are accepted (remote and local URLs are "
                         "refused unless an operator allow-lists their host)", param="messages")
    decode_image(data, max_bytes=http.max_image_bytes, max_pixels=http.max_image_pixels)
    return data


def usage(result: TandemResult) -> dict:
    """OpenAI's usage: completion tokens of every stage, those of reasoning stages among them; no
    engine here reuses a prompt prefix yet, so no prompt token is cached."""
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": result.reasoning_tokens}}


def chat_completion(result: TandemResult, chat: ChatRequest, created: int | None = None) -> dict:
    return {
        "id": chat.ask.request_id, "object": "chat.completion", "created": created or int(time.time()),
        "model": chat.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": result.answer},
                     "finish_reason": result.finish_reason, "logprobs": None}],
        "usage": usage(result), "tandem": result.trace(),
    }


def _chunk(chat: ChatRequest, created: int, delta: dict, finish: str | None = None, **extra) -> str:
    body = {"id": chat.ask.request_id, "object": "chat.completion.chunk", "created": created, "model": chat.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
    return f"data: {json.dumps(body)}\n\n"


def stream_start(chat: ChatRequest, created: int) -> str:
    return _chunk(chat, created, {"role": "assistant", "content": ""})


def stream_delta(chat: ChatRequest, created: int, kind: str, text: str) -> str:
    """One decoded piece: answer text as `content`, reasoning as `reasoning_content` (the vLLM and
    DeepSeek convention, which OpenAI clients pass through in `model_extra`)."""
    return _chunk(chat, created, {"content" if kind == "content" else "reasoning_content": text})


class AnswerStream:
    """The answer's deltas as the client must see them: the non-streamed answer is the final text
    stripped, so leading whitespace is dropped and trailing whitespace held until more text follows."""

    def __init__(self):
        self.sent, self._held = "", ""

    def feed(self, text: str) -> str:
        if not self.sent:
            text = text.lstrip()
        body = self._held + text
        kept = body.rstrip()
        self._held = body[len(kept):]
        self.sent += kept
        return kept

    def rest(self, answer: str) -> str:
        """What the client has not seen of the final answer (all of it when nothing streamed: an
        answer decided after it was made, such as mutual's agreement)."""
        return answer[len(self.sent):] if answer.startswith(self.sent) else ""


def stream_rest(result: TandemResult, chat: ChatRequest, created: int, pieces: list[str]) -> list[str]:
    """Content chunks (what remains of the answer), a closing chunk carrying usage and the trace,
    and [DONE]."""
    chunks = [_chunk(chat, created, {"content": p}) for p in pieces if p]
    chunks.append(_chunk(chat, created, {}, result.finish_reason, usage=usage(result), tandem=result.trace()))
    chunks.append("data: [DONE]\n\n")
    return chunks


def models_list() -> dict:
    return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "tandem"}
                                       for m in model_ids()]}


def answer_pieces(answer: str) -> list[str]:
    """The answer cut into word pieces for streaming; they concatenate back to the answer."""
    return re.findall(r"\s*\S+", answer) or ([answer] if answer else [])
