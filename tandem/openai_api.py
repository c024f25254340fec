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

from tandem.chat_schema import ChatBody, Message, TandemOptions, TextPart, json_shape_problem, parse_body, short
from tandem.config import HttpConfig, TandemConfig
from tandem.errors import BadRequest, NotFound, PayloadTooLarge, TandemError
from tandem.fetch import fetch_image
from tandem.images import check_resizable, decode_image
from tandem.policies import POLICIES, POLICY_NAMES, parse_policy_id
from tandem.schemas import AskRequest, TandemResult

MODEL_PREFIX = "tandem"
_DATA_URL = re.compile(r"^data:image/[a-zA-Z0-9.+-]+;base64,", re.I)


@dataclass
class ChatRequest:
    ask: AskRequest
    model: str
    stream: bool
    include_usage: bool = False  # stream_options.include_usage: usage in one extra final chunk
    return_reasoning: bool = False  # tandem.return_reasoning: message.reasoning in a whole response


def model_ids() -> list[str]:
    return [MODEL_PREFIX] + [f"{MODEL_PREFIX}:{p}" for p in POLICY_NAMES]


def policy_for_model(model: str, default: str) -> tuple[str, float | None]:
    """(policy, its parameter or None) named by a model id: `tandem`, `tandem:<policy>` or
    `tandem:<policy>@<value>`. 404 for a model that is not one; 400 for a bad parameter."""
    if model == MODEL_PREFIX:
        return default, None
    if model.startswith(MODEL_PREFIX + ":"):
        try:
            return parse_policy_id(model.split(":", 1)[1])
        except KeyError:
            pass
    raise NotFound(f"model {short(model)} does not exist; available: {', '.join(model_ids())} "
                   f"(a policy's parameter: tandem:<policy>@<value>)", param="model")


def parse_chat_request(body: bytes, config: TandemConfig, request_id: str | None = None) -> ChatRequest:
    http = config.http
    if len(body) > http.max_body_bytes:
        raise PayloadTooLarge(f"request body is {len(body)} bytes; the limit is {http.max_body_bytes}")
    try:
        data = json.loads(body)
    except json.JSONDecodeError as err:
        raise BadRequest(f"request body is not valid JSON (line {err.lineno}, column {err.colno})") from None
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("request body is not valid JSON (send UTF-8)") from None
    except RecursionError:
        raise BadRequest(f"request body nests deeper than {http.max_json_depth} levels") from None
    if problem := json_shape_problem(data, http.max_json_depth, http.max_json_items):
        raise BadRequest(problem)
    chat = parse_body(data)
    policy, param = policy_for_model(chat.model, config.policy.default)
    _refuse_unsupported(data)
    options = _tandem_options(chat, config)
    budget, effort = _reasoning_budget(chat, options, config)
    if effort and effort["reasoning_max_tokens"] == 0:
        policy, param = "large", None  # no reasoning at all: the large model answers directly
        effort["policy"] = "large"
    if chat.stream_options is not None and not chat.stream:
        raise BadRequest("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    bounds = [(m.min_pixels, m.max_pixels) for m in (config.small, config.large)]
    question, images = _parse_messages(chat.messages, http, bounds)
    return ChatRequest(
        ask=AskRequest(question=question, images=images, policy=policy, policy_param=param,
                       max_tokens=_max_tokens(chat, config), temperature=_temperature(chat),
                       request_id=request_id or f"chatcmpl-{uuid.uuid4().hex[:24]}",
                       stream_reasoning=options.stream_reasoning,
                       reasoning_max_tokens=budget, reasoning_effort=effort,
                       latency_budget_ms=None if options.latency_budget_ms is None else float(options.latency_budget_ms)),
        model=chat.model, stream=chat.stream, return_reasoning=options.return_reasoning,
        include_usage=bool(chat.stream_options and chat.stream_options.include_usage))


def _tandem_options(chat: ChatBody, config: TandemConfig) -> TandemOptions:
    """The body's `tandem` object, its bounds checked against the config (400 naming the field);
    `thinking_token_budget` (vLLM's name) stands for its `reasoning_max_tokens`."""
    options = chat.tandem or TandemOptions()
    if chat.thinking_token_budget is not None:
        if options.reasoning_max_tokens is not None:
            raise BadRequest("give 'thinking_token_budget' or 'tandem.reasoning_max_tokens', not both",
                             param="thinking_token_budget")
        options = options.model_copy(update={"reasoning_max_tokens": chat.thinking_token_budget})
    field = "thinking_token_budget" if chat.thinking_token_budget is not None else "tandem.reasoning_max_tokens"
    limit = config.limits.reasoning_max_tokens
    if options.reasoning_max_tokens is not None and not 1 <= options.reasoning_max_tokens <= limit:
        raise BadRequest(f"'{field}' must be an integer from 1 to {limit} (the server's "
                         f"reasoning limit); got {short(options.reasoning_max_tokens)}", param=field)
    deadline_ms = config.http.request_timeout_s * 1000
    if options.latency_budget_ms is not None and not 0 < options.latency_budget_ms <= deadline_ms:
        raise BadRequest(f"'tandem.latency_budget_ms' must be a number of milliseconds above 0 and at most "
                         f"{deadline_ms:g} (the request deadline); got {short(options.latency_budget_ms)}",
                         param="tandem.latency_budget_ms")
    return options


# OpenAI sampling fields Tandem does not implement, with the values that ask for the default (those
# pass) and why: refused otherwise, never silently ignored (a client that sets them expects them to act).
_NO_TOOLS, _TEXT_ONLY, _NO_LOGPROBS = "no tool calls", "text answers only", "no log-probabilities in responses"
_UNSUPPORTED: dict[str, tuple[tuple, str]] = {
    "n": ((1,), "one choice per request"), "top_p": ((1, 1.0), "greedy or plain temperature sampling only"),
    "seed": ((), "no seeded sampling"), "stop": (([], ""), "stages stop at their own stop strings"),
    "presence_penalty": ((0, 0.0), "not implemented"), "frequency_penalty": ((0, 0.0), "not implemented"),
    "logit_bias": (({},), "not implemented"), "logprobs": ((False,), _NO_LOGPROBS),
    "top_logprobs": ((0,), _NO_LOGPROBS), "tools": (([],), _NO_TOOLS), "tool_choice": (("none",), _NO_TOOLS),
    "functions": (([],), _NO_TOOLS), "function_call": (("none",), _NO_TOOLS),
    "response_format": (({"type": "text"},), _TEXT_ONLY), "audio": ((), _TEXT_ONLY),
    "modalities": ((["text"],), _TEXT_ONLY), "prediction": ((), "no predicted outputs"),
    "web_search_options": ((), "no web search"),
}


def _refuse_unsupported(data: dict) -> None:
    for key, (defaults, why) in _UNSUPPORTED.items():
        value = data.get(key)
        if value is None or any(value == d and type(value) is type(d) for d in defaults):
            continue
        raise BadRequest(f"'{key}' is not supported ({why}); omit it or send null"
                         + (f" or {defaults[0]!r}" if defaults else "") + f"; got {short(value)}", param=key)


def _reasoning_budget(chat: ChatBody, options: TandemOptions, config: TandemConfig) -> tuple[int | None, dict | None]:
    """(the request's reasoning budget, what its `reasoning_effort` applied). An effort from `low` up
    allows its configured share of `limits.reasoning_max_tokens` (a token budget given beside it
    caps that further); `none` and `minimal` allow none: the large model answers directly."""
    effort = chat.reasoning_effort
    if effort is None:
        return options.reasoning_max_tokens, None
    limit = config.limits.reasoning_max_tokens
    allowed = 0 if effort in ("none", "minimal") else max(1, int(getattr(config.limits.reasoning_effort, effort) * limit))
    if options.reasoning_max_tokens is not None and allowed:
        allowed = min(allowed, options.reasoning_max_tokens)
    return (allowed or None), {"effort": effort, "reasoning_max_tokens": allowed}


def _max_tokens(chat: ChatBody, config: TandemConfig) -> int | None:
    value = chat.max_completion_tokens if chat.max_completion_tokens is not None else chat.max_tokens
    if value is None:
        return None
    limit = config.limits.max_request_tokens
    if not 1 <= value <= limit:
        raise BadRequest(f"'max_tokens' must be an integer from 1 to {limit}; got {short(value)}", param="max_tokens")
    return value


def _temperature(chat: ChatBody) -> float | None:
    value = chat.temperature
    if value is None:
        return None
    if not 0.0 <= value <= 2.0:
        raise BadRequest(f"'temperature' must be a number from 0 to 2; got {short(value)}", param="temperature")
    return float(value)


def _parse_messages(messages: list[Message], http: HttpConfig,
                    bounds: list[tuple[int, int]]) -> tuple[str, list[bytes]]:
    """The conversation as one question text (turns in order) and its images in order, each image
    checked against every model's processor (`bounds`: their min and max pixels)."""
    texts: list[str] = []
    images: list[bytes] = []
    for i, message in enumerate(messages):
        for j, part in enumerate(message.content):
            if isinstance(part, TextPart):
                text = part.text
                texts.append(text if message.role == "user" else f"{message.role}: {text}")
            else:
                if len(images) >= http.max_images:
                    raise BadRequest(f"too many images; the limit is {http.max_images}", param="messages")
                images.append(_load_image(part.image_url.url, f"messages[{i}].content[{j}]", http, bounds))
    question = "\n".join(t for t in texts if t.strip())
    if not question.strip():
        raise BadRequest("the messages contain no text", param="messages")
    if len(question) > http.max_question_chars:
        raise PayloadTooLarge(f"message text is {len(question)} characters; the limit is {http.max_question_chars}",
                              param="messages")
    return question, images


def _load_image(url: str, where: str, http: HttpConfig, bounds: list[tuple[int, int]]) -> bytes:
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
    try:
        image = decode_image(data, max_bytes=http.max_image_bytes, max_pixels=http.max_image_pixels,
                             max_jpeg_scans=http.max_jpeg_scans)
        check_resizable(*image.size, bounds)
    except TandemError as err:
        raise type(err)(f"{where}: {err.message}", param="messages") from None
    return data


def usage(result: TandemResult) -> dict:
    """OpenAI's usage: completion tokens of every stage, those of reasoning stages among them, and the
    prompt tokens served from a kept prompt head (the transformers engine's prefix store, vLLM's cache)."""
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": result.reasoning_tokens}}


def chat_completion(result: TandemResult, chat: ChatRequest, created: int | None = None) -> dict:
    message = {"role": "assistant", "content": result.answer}
    if chat.return_reasoning:
        message["reasoning"] = result.reasoning or None  # vLLM's field: the whole reasoning of the path
    return {
        "id": chat.ask.request_id, "object": "chat.completion", "created": created or int(time.time()),
        "model": chat.model,
        "choices": [{"index": 0, "message": message, "finish_reason": result.finish_reason, "logprobs": None}],
        "usage": usage(result), "tandem": result.trace(),
    }


def _chunk(chat: ChatRequest, created: int, delta: dict | None, finish: str | None = None, **extra) -> str:
    """One SSE chunk; `delta` None: the usage chunk of `include_usage`, with empty choices. With
    `include_usage` every other chunk carries `"usage": null`, as OpenAI's do."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    if chat.include_usage:
        extra.setdefault("usage", None)
    body = {"id": chat.ask.request_id, "object": "chat.completion.chunk", "created": created, "model": chat.model,
            "choices": choices, **extra}
    return f"data: {json.dumps(body)}\n\n"


def stream_start(chat: ChatRequest, created: int) -> str:
    return _chunk(chat, created, {"role": "assistant", "content": ""})


def stream_delta(chat: ChatRequest, created: int, kind: str, text: str) -> str:
    """One decoded piece: answer text as `content`; reasoning as `reasoning` (vLLM's field) and, the
    same text, `reasoning_content` (its older name, DeepSeek's), which OpenAI clients pass through in
    `model_extra`."""
    if kind == "content":
        return _chunk(chat, created, {"content": text})
    return _chunk(chat, created, {"reasoning": text, "reasoning_content": text})


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
    """Content chunks (what remains of the answer), a closing chunk with the finish reason and the
    trace (and usage, unless `include_usage` asked for it in one extra final chunk with empty
    `choices`, as OpenAI sends it), and [DONE]."""
    chunks = [_chunk(chat, created, {"content": p}) for p in pieces if p]
    if chat.include_usage:
        chunks.append(_chunk(chat, created, {}, result.finish_reason, tandem=result.trace()))
        chunks.append(_chunk(chat, created, None, usage=usage(result)))
    else:
        chunks.append(_chunk(chat, created, {}, result.finish_reason, usage=usage(result), tandem=result.trace()))
    chunks.append("data: [DONE]\n\n")
    return chunks


def models_list(config: TandemConfig) -> dict:
    """Every policy as a model, with what it does and its parameter (name, bounds, default)."""
    data = [{"id": MODEL_PREFIX, "object": "model", "created": 0, "owned_by": "tandem",
             "tandem": {"policy": config.policy.default, "description": "the default policy"}}]
    for name, spec in POLICIES.items():
        meta = {"policy": name, "description": spec.description}
        if spec.param:
            p = spec.param
            meta["parameter"] = {"name": p.name, "min": p.low, "max": p.high, "description": p.description,
                                 "default": getattr(config.policy, p.config_field),
                                 "example": f"{MODEL_PREFIX}:{name}@{(p.low + p.high) / 2:g}"}
        data.append({"id": f"{MODEL_PREFIX}:{name}", "object": "model", "created": 0, "owned_by": "tandem",
                     "tandem": meta})
    return {"object": "list", "data": data}


def answer_pieces(answer: str) -> list[str]:
    """The answer cut into word pieces for streaming; they concatenate back to the answer."""
    return re.findall(r"\s*\S+", answer) or ([answer] if answer else [])
