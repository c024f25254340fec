"""The chat-completions request body as typed models (pydantic), and its validation errors as the
precise 400 messages clients get: which field, where in `messages`, what was sent (cut short).

Content parts are a discriminated union on `type`; a string content is one text part. Fields that
exist in OpenAI's API but not here pass the model (`extra="allow"`) and are judged by
`openai_api`, which refuses the unsupported ones by name. Checks that need the config (limits,
image decoding) stay in `openai_api`.
"""

from __future__ import annotations

import re
import reprlib
from typing import Annotated, Any, Literal, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, StrictBool, StrictFloat,
                      StrictInt, StrictStr, Tag, ValidationError, field_validator)
from pydantic_core import PydanticCustomError

from tandem.errors import BadRequest

ROLES = ("system", "user", "assistant", "developer")
MAX_MODEL_CHARS = 256  # model ids are short; a longer one is malformed input, not an unknown model
_ECHO_CHARS = 40


_REPR = reprlib.Repr()  # keyword arguments need Python 3.12
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 2, _ECHO_CHARS, _ECHO_CHARS, 4, 4


def short(value: Any) -> str:
    """A client's value as an error message may echo it: a bounded repr (nesting, length; ASCII-safe
    for lone surrogates), never the megabyte a client sent."""
    text = _REPR.repr(value)
    return text if len(text) <= 2 * _ECHO_CHARS else text[: 2 * _ECHO_CHARS] + "..."


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_unicode(text: str) -> str:
    """Valid JSON may still carry lone UTF-16 surrogates (`"\\ud800"`), which are not Unicode text and
    which no tokenizer can encode: refused, with where the first one is."""
    bad = _SURROGATE.search(text)
    if bad:
        raise PydanticCustomError("unicode", "is not valid Unicode: a lone UTF-16 surrogate at character {pos}",
                                  {"pos": bad.start()})
    return text


def json_shape_problem(value: Any, max_depth: int, max_items: int) -> str | None:
    """What is wrong with a decoded body's shape before any validation, or None: arrays and objects
    nested deeper than `max_depth`, or more than `max_items` values in all. Iterative (no recursion to
    exhaust), and it stops at the first problem: the work is bounded by the limits, not by the body, so
    a body of millions of elements never reaches the validator, which would build an error per element."""
    stack, seen = [(value, 1)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > max_items:
            return f"request body holds more than {max_items} JSON values"
        if isinstance(node, (list, dict)):
            if depth > max_depth:
                return f"request body nests deeper than {max_depth} levels"
            if len(node) > max_items:
                return f"request body holds more than {max_items} JSON values"
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return None


def _image_ref(value: Any) -> Any:
    return {"url": value} if isinstance(value, str) else value  # a bare URL string is accepted too


class ImageRef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    url: StrictStr = Field(min_length=1)
    detail: StrictStr | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr

    @field_validator("text")
    @classmethod
    def _valid_unicode(cls, text: str) -> str:
        return check_unicode(text)


class ImagePart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["image_url"]
    image_url: Annotated[ImageRef, BeforeValidator(_image_ref)]


def _part_type(value: Any) -> Any:
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)


Part = Annotated[Union[Annotated[TextPart, Tag("text")], Annotated[ImagePart, Tag("image_url")]],
                 Discriminator(_part_type)]


def _content(value: Any) -> Any:
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list) or not value:
        raise PydanticCustomError("content", "must be a string or a non-empty list of parts")
    return value


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal[ROLES]  # type: ignore[valid-type]
    content: Annotated[list[Part], BeforeValidator(_content)]


class TandemOptions(BaseModel):
    """The body's `tandem` object (the openai client sends it with `extra_body`)."""

    model_config = ConfigDict(extra="forbid")
    stream_reasoning: StrictBool = False
    return_reasoning: StrictBool = False
    reasoning_max_tokens: StrictInt | None = None  # bounded by the config's limit in openai_api
    latency_budget_ms: StrictInt | StrictFloat | None = None


class StreamOptions(BaseModel):
    """OpenAI's `stream_options`."""

    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


class ChatBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: StrictStr = Field(min_length=1, max_length=MAX_MODEL_CHARS)
    messages: list[Message] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    temperature: StrictFloat | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    reasoning_effort: Literal[EFFORTS] | None = None  # type: ignore[valid-type]
    thinking_token_budget: StrictInt | None = None  # vLLM's name for tandem.reasoning_max_tokens
    tandem: TandemOptions | None = None


def parse_body(data: Any) -> ChatBody:
    """A decoded JSON value as a ChatBody, or BadRequest with the first problem, precisely."""
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    try:
        return ChatBody.model_validate(data)
    except ValidationError as err:
        raise _bad_request(err.errors()[0]) from None


def _where(loc: tuple) -> str:
    """`messages[0].content[1].image_url.url` from pydantic's location (union tags dropped: the
    element after a content index names the part's type, not a field)."""
    out, skip = "", False
    for i, part in enumerate(loc):
        if skip:
            skip = False
            continue
        if isinstance(part, int):
            out += f"[{part}]"
            skip = i >= 1 and loc[i - 1] == "content"
        else:
            out += ("." if out else "") + str(part)
    return out


_TOP_LEVEL = {
    "model": "'model' must be a non-empty string",
    "messages": "'messages' must be a non-empty list",
    "max_tokens": "'max_tokens' must be an integer",
    "max_completion_tokens": "'max_completion_tokens' must be an integer",
    "temperature": "'temperature' must be a number from 0 to 2",
    "stream": "'stream' must be a boolean",
    "stream_options": "'stream_options' must be an object with a boolean 'include_usage'",
    "reasoning_effort": f"'reasoning_effort' must be one of {list(EFFORTS)}",
    "thinking_token_budget": "'thinking_token_budget' must be an integer",
    "tandem": "'tandem' must be an object",
}


def _bad_request(e: dict) -> BadRequest:
    loc, kind, value = tuple(e["loc"]), e["type"], e.get("input")
    param = str(loc[0]) if loc else None
    where = _where(loc)
    if kind == "unicode":  # our own validator's message (`check_unicode`), with the position
        return BadRequest(f"{where} {e['msg']}; send UTF-8 text", param=param)
    got = f"; got {short(value)}" if kind != "missing" else ""
    if loc == ("model",) and kind == "string_too_long":
        return BadRequest(f"'model' is over {MAX_MODEL_CHARS} characters; got {short(value)}", param="model")
    if len(loc) == 1 and param in _TOP_LEVEL:
        return BadRequest(_TOP_LEVEL[param] + got, param=param)
    if param == "tandem":
        if kind == "extra_forbidden":
            return BadRequest(f"unknown 'tandem' option {short(loc[-1])}; known: {list(TandemOptions.model_fields)}",
                              param=param)
        kinds = {"stream_reasoning": "a boolean", "return_reasoning": "a boolean", "reasoning_max_tokens": "an integer",
                 "latency_budget_ms": "a number of milliseconds"}
        field = str(loc[1]) if len(loc) > 1 else ""  # loc[2:], when there, names a union member
        return BadRequest(f"'tandem.{field}' must be {kinds.get(field, 'an object')}{got}", param=f"tandem.{field}")
    if param == "messages":
        if len(loc) == 2:
            return BadRequest(f"{where} must be an object{got}", param=param)
        field = loc[2]
        if field == "role":
            return BadRequest(f"{where} must be one of {list(ROLES)}{got}", param=param)
        if field == "content" and (len(loc) == 3 or kind == "content"):
            return BadRequest(f"{where} must be a string or a non-empty list of parts{got}", param=param)
        if kind in ("union_tag_invalid", "union_tag_not_found", "model_attributes_type"):
            return BadRequest(f"{where} must be a text or image_url part; got type {short(_part_type(value))}",
                              param=param)
        if loc[-1] == "url" or loc[-1] == "image_url":
            return BadRequest(f"{_where(loc[:-1] if loc[-1] == 'url' else loc)}.url must be a string{got}",
                              param=param)
        return BadRequest(f"{where} must be a string{got}" if kind.startswith("string")
                          else f"{where} has a wrong type or value{got}", param=param)
    return BadRequest(f"{where or 'request body'} has a wrong type or value{got}", param=param)
