"""What every generation engine reads and checks the same way: a request's placeholders against its
features, the checkpoint's own sampling advice, a token list cut into per-token text pieces, and a
stream's events as its decoding thread hands them over."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable

from tandem.errors import BadRequest
from tandem.prompts import IMAGE_PAD
from tandem.schemas import GenerationOutput, GenerationRequest, TokenDelta

# Committed tokens decoded again beside the new ones: a tokenizer may space a token by the one before
# it, and the window keeps each decode a few tokens long, not the whole sequence.
DETOKENIZE_CONTEXT = 4


# Below this temperature sampling is greedy (as in vLLM): logits divided by a tiny positive temperature
# overflow to inf, and softmax of inf is NaN.
GREEDY_BELOW = 1e-5


def expand_placeholders(request: GenerationRequest, model: str) -> str:
    """The prompt with each image's one placeholder repeated to its visual token count; 400 when the
    placeholders and the features differ, or the features are another model's."""
    parts = request.prompt.split(IMAGE_PAD)
    if len(parts) - 1 != len(request.images):
        raise BadRequest(f"prompt has {len(parts) - 1} image placeholders for {len(request.images)} images")
    for feat in request.images:
        if feat.model != model:
            raise BadRequest(f"features from model '{feat.model}' sent to model '{model}'")
    pads = [IMAGE_PAD * f.num_tokens for f in request.images] + [""]
    return "".join(p + pad for p, pad in zip(parts, pads))


def model_sampling(generation_config) -> dict:
    """How the checkpoint's generation_config says to sample (Qwen3 thinking models: temperature
    0.6, top_p 0.95, top_k 20); greedy where it says nothing or do_sample is off."""
    gen = generation_config
    if not getattr(gen, "do_sample", False) or not (getattr(gen, "temperature", None) or 0) > 0:
        return {"temperature": 0.0, "top_p": 1.0, "top_k": 0}
    return {"temperature": float(gen.temperature), "top_p": float(getattr(gen, "top_p", None) or 1.0),
            "top_k": int(getattr(gen, "top_k", None) or 0)}


def next_piece(detokenize: Callable[[list[int]], str], ids: list[int], committed: int, last: bool) -> str | None:
    """The text the tokens after `committed` complete, or None while they don't complete one. They are
    decoded together, after a few committed ones (byte-level BPE splits a character such as "é" or "°"
    across tokens: decoding token by token gives U+FFFD for each piece); a trailing U+FFFD is an
    unfinished character, held until its last byte arrives (or the sequence ends: `last`)."""
    start = max(0, committed - DETOKENIZE_CONTEXT)
    before = detokenize(ids[start:committed])
    window = detokenize(ids[start:])
    if (window.endswith("\ufffd") and not last) or not window.startswith(before):
        return None
    return window[len(before):]


def token_pieces(detokenize: Callable[[list[int]], str], ids: list[int]) -> list[str]:
    """Each token's share of the decoded text, the pieces joining to the whole. A character that
    byte-level BPE splits over tokens belongs to the token that completes it (the ones before get "")."""
    pieces, committed = [], 0
    for n in range(1, len(ids) + 1):
        piece = next_piece(detokenize, ids[:n], committed, last=n == len(ids))
        pieces.append(piece or "")
        committed = n if piece is not None else committed
    return pieces


def stop_token_ids(generation_config, tokenizer) -> set[int]:
    """The checkpoint's end-of-sequence ids, and the pad token's."""
    eos = generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos])
    ids.add(tokenizer.pad_token_id)
    return {i for i in ids if i is not None}


async def queued_events(queue: asyncio.Queue) -> AsyncIterator[TokenDelta | GenerationOutput]:
    """A stream's events as the thread decoding it puts them in `queue`: deltas, then the output; an
    exception put there instead is raised."""
    while True:
        event = await queue.get()
        if isinstance(event, BaseException):
            raise event
        yield event
        if isinstance(event, GenerationOutput):
            return
